"""What every trainer needs around its step: the fit loop, validation and checkpoint schedules, resume, tracking.

A trainer (RL today; SFT, DPO, distillation next) subclasses `TrainerBase` and supplies its step and its state:

    run_step() -> row           one training step, the metrics row it logs (`global_step` already advanced)
    validate() -> metrics       one validation pass (only called when `val_set` is set)
    save_state(dir) / load_state(dir)   the models' own checkpoints inside the step's checkpoint folder
    extra_state() / load_extra_state(d) small values saved with the loop's (e.g. the adaptive KL coefficient)
    required_files()            what a complete checkpoint holds (checked before it is committed)
    on_resumed() / close()      after a resume; once when fit ends, however it ends

The loop itself (`fit`) is the same for all: resume, validate first if asked, then per step run it, log the
row, validate every `trainer.test_freq` steps and at the end, checkpoint every `trainer.save_freq` steps and
at the end (atomically, rotated to `max_actor_ckpt_to_keep`; rlkit/utils/checkpoint_io.py).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlkit.trainer.interrupt import raise_if_interrupted

log = logging.getLogger("rlkit.trainer")


@dataclass
class FitSummary:
    """What a run did, for the summary table and the tests."""

    steps: int = 0
    first_val: dict[str, float] = field(default_factory=dict)
    last_val: dict[str, float] = field(default_factory=dict)
    train_scores: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)  # empty unless the scorer reports `acc`
    step_seconds: list[float] = field(default_factory=list)
    checkpoint: str | None = None
    log_dir: str | None = None
    memory_peaks: dict[str, float] = field(default_factory=dict)  # memory/<method>/<name>: the max over steps

    def record(self, row: dict[str, float], step_s: float) -> None:
        """One step's row: its score series and the memory peaks over the run."""
        for key, value in row.items():
            if key.startswith("memory/"):
                self.memory_peaks[key] = max(self.memory_peaks.get(key, 0.0), value)
        self.train_scores.append(row.get("critic/score/mean", math.nan))
        if "reward/acc/mean" in row:
            self.train_acc.append(row["reward/acc/mean"])
        self.step_seconds.append(step_s)


class TrainerBase:
    """The fit loop, its schedules, checkpoints and tracking; subclasses set these in `__init__`."""

    cfg: Any
    tracker: Any = None
    train_loader: Any
    val_set: Any = None
    total_steps: int
    global_step: int = 0
    ckpt_root: Path

    # ------------------------------------------------------------------ loop
    def fit(self) -> FitSummary:
        summary = FitSummary()
        try:
            resumed = self._maybe_resume()
            # after a resume the checkpoint's step already has its row: validating "before training" would log a
            # second row of that step, so only a run from step 0 validates first
            if self.val_set is not None and self.cfg.trainer.val_before_train and resumed is None:
                summary.first_val = self.validate()
                self._log(summary.first_val)
            while self.global_step < self.total_steps:
                raise_if_interrupted()  # a Ctrl-C that library code swallowed still stops the run here
                self.global_step += 1
                start = time.perf_counter()
                row = self.run_step()
                step_s = time.perf_counter() - start
                row = self.finish_row(row, step_s)
                summary.record(row, step_s)
                last = self.global_step == self.total_steps
                if self.val_set is not None and (last or _every(self.cfg.trainer.test_freq, self.global_step)):
                    summary.last_val = self.validate()
                    row.update(summary.last_val)
                self._log(row)  # before the save: a stop in between replays (and rewinds) this step, never loses it
                if last or _every(self.cfg.trainer.save_freq, self.global_step):
                    summary.checkpoint = str(self.save_checkpoint())
        finally:
            self.close()
        summary.steps = self.global_step
        return summary

    def run_step(self) -> Any:
        raise NotImplementedError

    def finish_row(self, result: Any, step_s: float) -> dict[str, float]:
        """The logged row of a step's result, now that its duration is known."""
        row = dict(result)
        row["timing_s/step"] = step_s
        return row

    def validate(self) -> dict[str, float]:
        raise NotImplementedError

    def close(self) -> None:
        """Called once when `fit` ends (normally or not): stop what the trainer started."""

    # ---------------------------------------------------------- checkpoints
    def save_state(self, folder: Path) -> None:
        raise NotImplementedError

    def load_state(self, folder: Path) -> None:
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what `extra_state` saved."""

    def required_files(self) -> list[str]:
        return []

    def on_resumed(self, path: Path | None) -> None:
        """After `_maybe_resume` (`path` None: nothing was resumed)."""

    def save_checkpoint(self) -> Path:
        from rlkit.utils.checkpoint_io import begin_checkpoint, commit_checkpoint, save_rng_state

        tmp = begin_checkpoint(self.ckpt_root, self.global_step)
        self.save_state(tmp)
        state = {
            "global_step": self.global_step,
            "dataloader": self.train_loader.state_dict(),
            "rng": save_rng_state(),
            **self.extra_state(),
        }
        torch.save(state, tmp / "trainer_state.pt")
        (tmp / "config.json").write_text(json.dumps(_plain(self.cfg), indent=1, default=str))
        required = ["trainer_state.pt", "config.json", *self.required_files()]
        return commit_checkpoint(self.ckpt_root, tmp, self.global_step, self.cfg.trainer.max_actor_ckpt_to_keep,
                                 required=required)

    def _maybe_resume(self) -> Path | None:
        """Load the checkpoint resume_mode picks (auto: the newest that loads, saying which it skipped); returns it."""
        from rlkit.utils.checkpoint_io import load_with_fallback

        path = load_with_fallback(self.ckpt_root, self.cfg.trainer.resume_mode, self._load_checkpoint, log.warning)
        if self.tracker is not None and hasattr(self.tracker, "rewind"):
            # the steps after the checkpoint run again, and without one the whole run does (validation before
            # training included): drop their old rows so that each step appears once
            self.tracker.rewind(self.global_step if path is not None else -1)
        self.on_resumed(path)
        return path

    def _load_checkpoint(self, path: Path) -> None:
        from rlkit.utils.checkpoint_io import load_rng_state

        log.warning("resuming from %s", path)
        self.load_state(path)
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        self.global_step = int(state["global_step"])
        self.train_loader.load_state_dict(state["dataloader"])
        load_rng_state(state["rng"])
        self.load_extra_state(state)

    # ------------------------------------------------------------- tracking
    def _progress(self, phase: str, done: int, total: int) -> None:
        if self.tracker is not None and hasattr(self.tracker, "progress"):
            self.tracker.progress(phase, done, total)

    def _log(self, metrics: dict[str, Any]) -> None:
        if self.tracker is not None:
            self.tracker.log(metrics, step=self.global_step)


def _every(freq: int, step: int) -> bool:
    return freq > 0 and step % freq == 0


def _plain(cfg: Any) -> dict:
    from rlkit.config.load import to_dict

    return to_dict(cfg)
