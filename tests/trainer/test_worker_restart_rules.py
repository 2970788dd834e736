"""The fit loop's rules for a dead worker (trainer.max_worker_restarts), on a trainer whose steps are counters:
restart from the last complete checkpoint (or the run's start), each step logged once, and stop on a second
death in the same step or past the limit. The real SIGKILL run is tests/trainer/test_replay_restart.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.trainer.run.trainer_base import TrainerBase


class Died(RuntimeError):
    """Stands for the failed worker call a dead worker causes."""


class Loader:
    def __init__(self) -> None:
        self.batches = 0

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = state["batches"]


class Rows:
    def __init__(self) -> None:
        self.rows: list[int] = []

    def log(self, metrics: dict, step: int) -> None:
        self.rows.append(step)

    def rewind(self, step: int) -> None:
        self.rows = [s for s in self.rows if s <= step]


class CountingTrainer(TrainerBase):
    """Each step takes a batch from the loader; a step listed in `deaths` raises Died (once per listing)."""

    def __init__(self, deaths: list[int], limit: int = 3, save_freq: int = 2, total: int = 6,
                 ckpt_root: Path = Path("unused")) -> None:
        self.cfg = SimpleNamespace(trainer=SimpleNamespace(val_before_train=False, test_freq=-1, save_freq=save_freq,
                                                           max_worker_restarts=limit, resume_mode="disable"))
        self.deaths, self.total_steps, self.ckpt_root = list(deaths), total, ckpt_root
        self.train_loader, self.tracker = Loader(), Rows()
        self.ran: list[int] = []
        self.restarts = 0
        self.saved: dict[Path, int] = {}

    def run_step(self) -> dict:
        self.ran.append(self.global_step)
        if self.deaths and self.deaths[0] == self.global_step:
            self.deaths.pop(0)
            raise Died(f"died in step {self.global_step}")
        self.train_loader.batches += 1
        return {"batch": float(self.train_loader.batches)}

    def worker_death(self, exc: BaseException) -> str | None:
        return str(exc) if isinstance(exc, Died) else None

    def restart_workers(self) -> None:
        self.restarts += 1

    def save_checkpoint(self) -> Path:
        self.last_checkpoint = Path(f"global_step_{self.global_step}")
        self.saved[self.last_checkpoint] = self.train_loader.batches
        return self.last_checkpoint

    def _load_checkpoint(self, path: Path) -> None:
        self.global_step = int(path.name.rsplit("_", 1)[1])
        self.train_loader.batches = self.saved[path]

    def on_resumed(self, path: Path | None) -> None:
        pass


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fit() publishes status.json in the checkpoint root ('unused', relative): keep it out of the checkout."""
    monkeypatch.chdir(tmp_path)


def test_a_death_reruns_the_steps_since_the_last_checkpoint_and_logs_each_once():
    t = CountingTrainer(deaths=[4])
    summary = t.fit()
    assert t.ran == [1, 2, 3, 4, 3, 4, 5, 6] and t.restarts == 1 and len(t.restart_seconds) == 1
    assert t.tracker.rows == [1, 2, 3, 4, 5, 6] and summary.steps == 6
    assert len(summary.step_seconds) == 6 and t.train_loader.batches == 6  # the data order as without the death


def test_a_death_before_the_first_checkpoint_restarts_from_the_run_start():
    t = CountingTrainer(deaths=[1], save_freq=3)
    t.fit()
    assert t.ran == [1, 1, 2, 3, 4, 5, 6] and t.tracker.rows == [1, 2, 3, 4, 5, 6] and t.train_loader.batches == 6


def test_a_second_death_in_the_same_step_stops_the_run():
    t = CountingTrainer(deaths=[3, 3])
    with pytest.raises(Died, match="died in step 3"):
        t.fit()
    assert t.ran == [1, 2, 3, 3] and t.restarts == 1


def test_more_deaths_than_max_worker_restarts_stop_the_run():
    t = CountingTrainer(deaths=[2, 5], limit=1)
    with pytest.raises(Died, match="died in step 5"):
        t.fit()
    assert t.restarts == 1
    with pytest.raises(Died):
        CountingTrainer(deaths=[2], limit=0).fit()


def test_an_error_that_is_no_death_is_raised_at_once():
    t = CountingTrainer(deaths=[])
    t.run_step = lambda: (_ for _ in ()).throw(ValueError("a plain bug"))  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="a plain bug"):
        t.fit()
    assert t.restarts == 0
