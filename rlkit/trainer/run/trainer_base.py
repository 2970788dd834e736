"""What every trainer needs around its step: the fit loop, validation and checkpoint schedules, resume, tracking.

A trainer (RL today; SFT, DPO, distillation next) subclasses `TrainerBase` and supplies its step and its state:

    run_step() -> row           one training step, the metrics row it logs (`global_step` already advanced)
    validate() -> metrics       one validation pass (only called when `val_set` is set)
    save_state(dir) / load_state(dir)   the models' own checkpoints inside the step's checkpoint folder
    extra_state() / load_extra_state(d) small values saved with the loop's (e.g. the adaptive KL coefficient)
    required_files()            what a complete checkpoint holds (checked before it is committed)
    on_resumed() / close()      after a resume; once when fit ends, however it ends
    worker_death(exc) / restart_workers()   names a dead worker process behind a failed step; replaces them all

The loop itself (`fit`) is the same for all: resume, validate first if asked, then per step run it, log the
row, validate every `trainer.test_freq` steps and at the end, checkpoint every `trainer.save_freq` steps and
at the end (atomically, rotated to `max_actor_ckpt_to_keep`; rlkit/utils/checkpoint_io.py). When a step fails
because a worker process died, the loop restarts the workers from this run's last complete checkpoint (or its
start) and goes on, dropping the rows logged after it, at most `trainer.max_worker_restarts` times and never
twice for the same step.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlkit.errors import UserError
from rlkit.runs.publish import begin_run_status
from rlkit.runs.status import RunStatus
from rlkit.trainer.run.hang_watch import OFF as HANG_WATCH_OFF
from rlkit.trainer.run.hang_watch import HangStopped, HangWatch
from rlkit.trainer.run.interrupt import _ACTIVE as interrupt_watches
from rlkit.trainer.run.interrupt import raise_if_interrupted
from rlkit.utils.memory_peak import DRIVER_PEAK, PhasePeaks

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

    def rewind(self, steps: int) -> None:
        """Keep the first `steps` steps' values (a worker restart runs the later ones again)."""
        del self.train_scores[steps:], self.step_seconds[steps:]
        self.train_acc = self.train_acc[:steps]

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

    last_checkpoint: Path | None = None  # the newest complete checkpoint of this run (saved or resumed)
    hang_watch: HangWatch = HANG_WATCH_OFF  # trainer.hang_timeout_s: a phase that makes no progress is named (fit)
    watch_hangs = True  # False in a debug run (a process paused for the debugger is no hang)
    status: RunStatus  # what `rlkit runs` / `rlkit top` read (rlkit/runs/status.py), from fit's start
    restart_seconds: list[float]  # how long each worker restart took (trainer.max_worker_restarts)

    # ------------------------------------------------------------------ loop
    def fit(self) -> FitSummary:
        summary = FitSummary()
        self.restart_seconds = []
        self.hang_watch = self._hang_watch().start()
        self.status = begin_run_status(self)  # <default_local_dir>/status.json for `rlkit runs` / `rlkit top`
        try:
            resumed = self._maybe_resume()
            start = self._snapshot()  # where a worker restart before the first checkpoint goes back to
            # after a resume the checkpoint's step already has its row: validating "before training" would log a
            # second row of that step, so only a run from step 0 validates first
            if self.val_set is not None and self.cfg.trainer.val_before_train and resumed is None:
                with self.status.phased("validate"):
                    summary.first_val = self.validate()
                self._log(summary.first_val)
            died_at: int | None = None
            while self.global_step < self.total_steps:
                raise_if_interrupted()  # a Ctrl-C that library code swallowed still stops the run here
                try:
                    self._fit_step(summary)
                except Exception as exc:
                    if self.hang_watch.fired is not None:
                        raise  # the hang watch stopped the workers: named below, never restarted
                    death = self.worker_death(exc)
                    if death is None or not self._may_restart(death, died_at):
                        raise
                    died_at = self.global_step
                    try:
                        self._restart(start, summary)
                    except UserError as no_room:  # e.g. a lost node: the placement no longer fits the cluster
                        log.error("not restarting: %s", no_room)
                        raise exc from None  # the death, reported with the resume line
            self.status.end(None)
        except BaseException as exc:
            self._raise_if_hung(exc)
            raise
        finally:
            self.hang_watch.stop()
            self.close()
            self.status.end(sys.exc_info()[1], interrupted=any(w.hit for w in interrupt_watches))
        summary.steps = self.global_step
        return summary

    def _fit_step(self, summary: FitSummary) -> None:
        """One step of the loop: run it, log its row, validate and checkpoint on their schedules."""
        self.global_step += 1
        start = time.perf_counter()
        driver = PhasePeaks()  # this process's own peak: the batches, the tokenizer, the data it holds
        with driver.measure("driver"), self.hang_watch.phase("step"):
            row = self.run_step()
        step_s = time.perf_counter() - start
        row = self.finish_row(row, step_s)
        peak = driver.pop()["driver"]
        row[DRIVER_PEAK] = peak.get("rss_peak_gb", peak.get("rss_end_gb", 0.0))
        summary.record(row, step_s)
        last = self.global_step == self.total_steps
        if self.val_set is not None and (last or _every(self.cfg.trainer.test_freq, self.global_step)):
            with self.status.phased("validate"):
                summary.last_val = self.validate()
            row.update(summary.last_val)
        self._log(row)  # before the save: a stop in between replays (and rewinds) this step, never loses it
        if last or _every(self.cfg.trainer.save_freq, self.global_step):
            with self.status.phased("checkpoint"):
                summary.checkpoint = str(self.save_checkpoint())

    # ------------------------------------------------------- worker restarts
    def worker_death(self, exc: BaseException) -> str | None:
        """The line naming a worker process whose death caused `exc` (None: not a death; it is raised)."""
        return None

    def restart_workers(self) -> None:
        """Replace every worker group with fresh processes (the models as built, before any checkpoint)."""
        raise NotImplementedError

    def _may_restart(self, death: str, died_at: int | None) -> bool:
        limit = self.cfg.trainer.max_worker_restarts
        log.error(death)
        if died_at == self.global_step:
            log.error("not restarting: a second worker death in step %d", self.global_step)
            return False
        if len(self.restart_seconds) >= limit:
            log.error("not restarting: trainer.max_worker_restarts=%d reached", limit)
            return False
        return True

    def _restart(self, start: dict[str, Any], summary: FitSummary) -> None:
        """Fresh workers, the last complete checkpoint (or the run's start) loaded, its later rows dropped."""
        began = time.perf_counter()
        died_at = self.global_step
        self.restart_workers()
        if self.last_checkpoint is not None:
            self._load_checkpoint(self.last_checkpoint)
        else:
            self._load_trainer_state(start)
        if self.tracker is not None and hasattr(self.tracker, "rewind"):
            self.tracker.rewind(self.global_step)
        summary.rewind(self.global_step - start["global_step"])
        self.on_resumed(self.last_checkpoint)
        self.restart_seconds.append(time.perf_counter() - began)
        log.warning("workers restarted in %.1fs (restart %d of at most %d) from %s; step %d runs again from step %d",
                    self.restart_seconds[-1], len(self.restart_seconds), self.cfg.trainer.max_worker_restarts,
                    self.last_checkpoint or "the run's start", died_at, self.global_step + 1)

    # ------------------------------------------------------------- hangs
    def _hang_watch(self) -> HangWatch:
        """The watch of this run's phases (off where the config has no trainer.hang_timeout_s, or it is 0/null)."""
        from rlkit.trainer.run.preflight import log_dir_of

        timeout = getattr(self.cfg.trainer, "hang_timeout_s", None) if self.watch_hangs else None
        return HangWatch(timeout, Path(log_dir_of(self.cfg)) if timeout else None, processes=self.watched_processes,
                         on_hang=self.stop_for_hang, step=lambda: self.global_step)

    def watched_processes(self) -> list[tuple[int, str, int | None]]:
        """(pid, label, rank) of every worker process: whose stacks a hang report reads."""
        groups = getattr(getattr(self, "workers", None), "groups", None) or []
        return [(pid, f"{'+'.join(r or 'worker' for r in g.roles)} rank {rank} ({g.name_prefix}:{rank})", rank)
                for g in groups for rank, pid in enumerate(g.pids)]

    def stop_for_hang(self) -> None:
        """Stop every worker process (called from the hang watch's thread): the driver's wait on them ends."""
        workers = getattr(self, "workers", None)
        if workers is not None:
            workers.shutdown()

    def _raise_if_hung(self, exc: BaseException) -> None:
        """A failure caused by the hang watch stopping the workers is the hang it named."""
        report = self.hang_watch.fired
        if report is not None and not isinstance(exc, HangStopped):
            raise HangStopped(report, self.total_steps, self.last_checkpoint) from exc

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
        from rlkit.utils.checkpoint_io import (
            abandon_checkpoint,
            begin_checkpoint,
            commit_checkpoint,
            disk_full,
            save_rng_state,
        )

        tmp = begin_checkpoint(self.ckpt_root, self.global_step)
        try:
            with self.hang_watch.phase("save_checkpoint"):
                self.save_state(tmp)
            state = {
                "global_step": self.global_step,
                "dataloader": self.train_loader.state_dict(),
                "rng": save_rng_state(),
                **self.extra_state(),
            }
            torch.save(state, tmp / "trainer_state.pt")
            (tmp / "config.json").write_text(json.dumps(_plain(self.cfg), indent=1, default=str))
        except Exception as exc:  # the disk filled up: one line, the partial copy removed, the older ones untouched
            if not disk_full(exc):
                raise
            raise abandon_checkpoint(self.ckpt_root, tmp, self.global_step, exc) from exc
        required = ["trainer_state.pt", "config.json", *self.required_files()]
        self.last_checkpoint = commit_checkpoint(self.ckpt_root, tmp, self.global_step,
                                                 self.cfg.trainer.max_actor_ckpt_to_keep, required=required)
        return self.last_checkpoint

    def _snapshot(self) -> dict[str, Any]:
        """The loop's own state, as a checkpoint's trainer_state.pt holds it."""
        from rlkit.utils.checkpoint_io import save_rng_state

        return {"global_step": self.global_step, "dataloader": self.train_loader.state_dict(),
                "rng": save_rng_state(), **self.extra_state()}

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
        log.warning("resuming from %s", path)
        self.load_state(path)
        self._load_trainer_state(torch.load(path / "trainer_state.pt", weights_only=False))
        self.last_checkpoint = path

    def _load_trainer_state(self, state: dict[str, Any]) -> None:
        from rlkit.utils.checkpoint_io import load_rng_state

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
        self.status.logged(metrics, self.global_step)


def _every(freq: int, step: int) -> bool:
    return freq > 0 and step % freq == 0


def _plain(cfg: Any) -> dict:
    from rlkit.config.load import to_dict

    return to_dict(cfg)
