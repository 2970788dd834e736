"""Step records: what `rlkit debug replay` needs to run a step's updates again, saved by the run.

A record is the `Batch` the actor/critic updates of step N received (after rollout, reward, old/ref log-probs,
values and advantages), the RNG states of the driver and of every trainer worker at that moment, and the run's
config. The run saves one for every step in `trainer.debug.record_steps` (as soon
as the batch is complete, so a step that dies in its update still has it) and one for a step that fails after
its batch was made. Records live next to the checkpoints they start from, in
`<trainer.default_local_dir>/steps/step_N.pt`, so the run's checkpoint root names both. A replay of step N starts
from the checkpoint before N and replays the steps since, so those steps are recorded too (`steps_to_record`), and
the checkpoint rotation keeps that checkpoint (rlkit.utils.checkpoint_io.replay_bases): a recorded step of a
finished run replays whatever the rotation did. Between steps the recorder holds only a reference to the last
batch: no copy, no I/O.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlkit.errors import UserError
from rlkit.protocol import METRICS_KEY, Batch
from rlkit.utils.checkpoint_io import RECORD_DIR, RECORD_FILE

log = logging.getLogger("rlkit.trainer")



@dataclass
class StepRecord:
    """One step's update inputs, and where the run keeps its checkpoints."""

    step: int
    batch: Batch
    cfg: Any  # the run's RLConfig
    model_path: str  # the policy's resolved local folder
    total_steps: int  # sizes the LR schedules, as in the run
    checkpoint_root: str
    log_dir: str
    world_size: int = 1  # the trainer group's data-parallel workers
    rollout_order: list[int] | None = None  # trainer.balance_batch's reordering: row i was generated as row order[i]
    worker_rng: list[dict[str, Any]] = field(default_factory=list)  # per trainer-group rank (recorded steps)
    driver_rng: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None  # the error of a step that failed


def steps_to_record(asked: list[int], save_freq: int) -> set[int]:
    """The asked steps and, for each, the steps between the checkpoint before it and it (every step before it when
    the run saves no checkpoint before the end, save_freq <= 0): what its replay needs."""
    steps = set()
    for n in (int(s) for s in asked):
        base = (n - 1) // save_freq * save_freq if save_freq > 0 else 0
        steps.update(range(base + 1, n + 1))
    return steps


def record_path(checkpoint_root: str | Path, step: int) -> Path:
    return Path(checkpoint_root) / RECORD_DIR / f"step_{step}.pt"


def save_record(record: StepRecord) -> Path:
    """Write the record atomically (a reader sees the whole file or none)."""
    path = record_path(record.checkpoint_root, record.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(record, tmp)
    os.replace(tmp, path)
    return path


def load_record(path: Path) -> StepRecord:
    try:
        record = torch.load(path, weights_only=False)
    except Exception as exc:  # a torn or foreign file
        raise UserError(f"{path}: not a step record ({type(exc).__name__}: {exc}); record the step again with "
                        "trainer.debug.record_steps=[N]") from None
    if not isinstance(record, StepRecord):
        raise UserError(f"{path}: not a step record; record the step with trainer.debug.record_steps=[N]")
    return record


def recorded_steps(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := RECORD_FILE.match(p.name)))


def record_folders(target: Path) -> list[Path]:
    """Where a run's records may be, given what a user points at: the checkpoint root, a `global_step_N` folder
    in it, or the default log dir in it (`<root>/logs`)."""
    target = target.expanduser()
    return [c for c in dict.fromkeys([target / RECORD_DIR, target.parent / RECORD_DIR]) if c.is_dir()]


def find_record(target: Path, step: int) -> Path:
    """The record of `step` for a run or checkpoint path (see `record_folders`), or a record file itself."""
    if target.is_file():
        return target
    if not target.exists():
        raise UserError(f"{target}: no such run, checkpoint or record; pass the run's checkpoint root "
                        "(trainer.default_local_dir)")
    folders = record_folders(target)
    for folder in folders:
        path = folder / f"step_{step}.pt"
        if path.is_file():
            return path
    have = sorted({s for folder in folders for s in recorded_steps(folder)})
    if have:
        raise UserError(f"{target}: step {step} was not recorded (recorded: {', '.join(map(str, have))}); rerun with "
                        f"trainer.debug.record_steps=[{step}]")
    raise UserError(f"{target}: no step records here; run with trainer.debug.record_steps=[{step}] (they go to "
                    f"<trainer.default_local_dir>/{RECORD_DIR}/) and pass that run's checkpoint root")


class StepRecorder:
    """The run's side: `before_update` at the point the step's batch is complete, `failed` when a step raises."""

    def __init__(self, cfg: Any, model_path: str, total_steps: int, log_dir: str, world_size: int,
                 worker_rng: Callable[[], list[dict[str, Any]]]) -> None:
        self.cfg, self.model_path, self.total_steps, self.log_dir = cfg, model_path, total_steps, log_dir
        self.world_size = world_size
        self.steps = steps_to_record(cfg.trainer.debug.record_steps, cfg.trainer.save_freq)
        extra = sorted(self.steps - {int(s) for s in cfg.trainer.debug.record_steps})
        if extra:
            log.info("recording steps %s too: the replay of a recorded step starts from the checkpoint before it "
                     "(trainer.save_freq=%s) and replays the steps since", extra, cfg.trainer.save_freq)
        self.checkpoint_root = str(Path(cfg.trainer.default_local_dir).expanduser().resolve())
        self._worker_rng = worker_rng
        self._pending: StepRecord | None = None
        self._order: list[int] | None = None

    def start(self, step: int) -> None:
        """A new step begins: forget the last one's batch."""
        self._pending, self._order = None, None

    def reordered(self, order: torch.Tensor) -> None:
        """The step's rows were put in this order after generation (`rlkit debug replay --role rollout`)."""
        self._order = order.tolist()

    def before_update(self, step: int, batch: Batch) -> None:
        """The batch the updates receive (a shallow copy: the updates only add keys); written now if asked."""
        from rlkit.utils.checkpoint_io import save_rng_state

        kept = Batch(dict(batch.tensors), dict(batch.non_tensors),
                     {k: v for k, v in batch.meta.items() if k != METRICS_KEY})
        asked = step in self.steps
        self._pending = StepRecord(step, kept, self.cfg, self.model_path, self.total_steps, self.checkpoint_root,
                                   self.log_dir, self.world_size, self._order,
                                   worker_rng=self._worker_rng() if asked else [], driver_rng=save_rng_state())
        if asked:
            path = save_record(self._pending)
            log.info("step %d recorded: %s (rlkit debug replay %s --step %d)", step, path, self.checkpoint_root, step)

    def failed(self, step: int, exc: BaseException) -> Path | None:
        """Save the failed step's batch (when it got that far); returns the record's path."""
        record = self._pending
        if record is None or record.step != step:
            return None
        record.failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        try:
            path = save_record(record)
        except OSError as err:  # the run's own error matters more than its record
            log.warning("could not record failed step %d: %s", step, err)
            return None
        log.warning("step %d failed; its batch is recorded: rlkit debug replay %s --step %d", step,
                    self.checkpoint_root, step)
        return path
