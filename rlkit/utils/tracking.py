"""Experiment trackers behind one facade: `Tracking(["console", "jsonl"], ...).log(metrics, step)`.

Backends are looked up by name in `TRACKERS` (the names written in `trainer.logger`), so a
new one is a class plus a decorator. Metrics arrive as floats, tensors or lists (per-sample
values from `Batch.meta["metrics"]`); the facade reduces everything to one float per key
before any backend sees it, so all backends log identical numbers.

This module imports every built-in backend, so what looks trackers up by name (the facade and
the pre-flight's `missing_tracker_packages`) lives here and always sees all of them.
Validation generations (`trainer.log_val_generations`) reach every backend that has `log_generations`:
rows of {input, output, score} per validation step, as a table where the backend has one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rlkit.utils.console_tracker  # noqa: F401  (registers "console")
import rlkit.utils.tracker_backends  # noqa: F401  (registers the other built-in trackers)
import rlkit.utils.tracker_trackio  # noqa: F401  (registers "trackio")
from rlkit.utils.tracker_base import (
    TRACKERS,
    Generation,
    RunInfo,
    Tracker,
    importable,
    plain_config,
    to_floats,
    tracker_names,
)

log = logging.getLogger("rlkit.tracking")


def missing_tracker_packages(backends: Sequence[str] | str) -> list[str]:
    """One line per tracker of `trainer.logger` whose package is not installed, with the pip command (checked
    before Ray starts, so a missing package fails in seconds, not after the workers load)."""
    problems = []
    for name in dict.fromkeys(tracker_names(backends)):
        cls = TRACKERS.get(name)
        for module in getattr(cls, "packages", ()):
            if not importable(module):
                problems.append(f"trainer.logger: tracker '{name}' needs the {module} package, which is not "
                                f"installed: {cls.install}, or drop '{name}' from trainer.logger")
    return problems


class Tracking:
    """Fan metrics out to several backends: `with Tracking(["console", "jsonl"], ...) as t: t.log(m, step)`."""

    def __init__(
        self,
        backends: list[str] | str,
        project: str = "rlkit",
        experiment: str = "run",
        log_dir: str | Path | None = None,
        total_steps: int | None = None,
        config: Any = None,
    ) -> None:
        names = tracker_names(backends)
        classes = [TRACKERS.get(name) for name in names]  # unknown names fail before anything starts
        run = RunInfo(project, experiment, Path(log_dir or Path("logs") / project / experiment),
                      total_steps, plain_config(config))
        self.run = run
        self.trackers: list[Tracker] = []
        try:
            for cls in dict.fromkeys(classes):  # "file" and "jsonl" are one backend
                self.trackers.append(cls(run))
        except BaseException:
            self.finish()
            raise
        self._finished = False

    def progress(self, phase: str, done: int, total: int) -> None:
        """Progress inside a step (e.g. validation prompts done / total) for the backends that show it."""
        for tracker in self.trackers:
            if hasattr(tracker, "progress"):
                tracker.progress(phase, done, total)

    def log(self, metrics: dict[str, Any], step: int) -> dict[str, float]:
        """Reduce `metrics` to floats and send them to every backend; returns what was logged."""
        reduced = to_floats(metrics)
        for tracker in self.trackers:
            tracker.log(reduced, step)
        return reduced

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        """Validation generations ({input, output, score} each) to every backend that logs them."""
        for tracker in self.trackers:
            if hasattr(tracker, "log_generations"):
                tracker.log_generations(samples, step)

    def rewind(self, step: int) -> None:
        """After a resume from `step` (-1: a run that starts again from nothing): backends that can (jsonl,
        tensorboard) forget what they logged after it, so replayed steps are not recorded twice. wandb cannot
        rewrite history; its rows stay."""
        for tracker in self.trackers:
            if hasattr(tracker, "rewind"):
                dropped = tracker.rewind(step)
                if dropped:
                    where = getattr(tracker, "path", type(tracker).__name__)
                    if step < 0:
                        log.warning("%s: dropped %d rows of an earlier run (this run starts again from step 0)",
                                    where, dropped)
                    else:
                        log.warning("%s: dropped %d rows logged after step %d (they are replayed after the resume)",
                                    where, dropped, step)

    def finish(self) -> None:
        """Close every backend once (safe to call twice)."""
        if getattr(self, "_finished", False):
            return
        self._finished = True
        for tracker in self.trackers:
            tracker.finish()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
