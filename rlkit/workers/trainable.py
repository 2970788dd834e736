"""What every trained role (actor, critic) shares: its checkpoint calls and the per-update LR step."""

from __future__ import annotations

from pathlib import Path

from rlkit.controller import Dispatch, register
from rlkit.workers.fsdp_model import FSDPModel


class TrainableModelRole:
    """Mixin for a Worker that owns `self.model: FSDPModel` with an optimizer and an LR schedule."""

    model: FSDPModel

    def finish_update(self, metrics: dict[str, list[float]], prefix: str) -> None:
        """Record the LR this update used, then advance the schedule (once per update call)."""
        assert self.model.scheduler is not None, "init_model() sets up the optimizer and its schedule"
        metrics[f"{prefix}/lr"].append(self.model.scheduler.get_last_lr()[0])
        self.model.scheduler.step()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self.model.save(Path(path))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.model.load(Path(path))
