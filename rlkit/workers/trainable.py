"""What every trained role (actor, critic) shares: the update loop, its checkpoint calls and the LR step.

The loop is the same for every role; only the loss differs. A role passes an `UpdatePlan`
(epochs, mini-batch rows, micro-batching, loss aggregation, clipping) and a `MicroLoss`, the
function from one micro-batch to its loss and metrics:

    for each epoch (optionally reshuffled):
        for each mini-batch:                   one optimizer step
            micro-batches, by count or by a token budget
            loss_scales: weights so the micro-batch losses sum to the mini-batch's loss
            for each micro-batch: loss_fn -> (loss * weight).backward()
            clip the global grad norm, step (`<prefix>/grad_norm`)
    record `<prefix>/lr`, advance the LR schedule
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlkit.config.checkpoint_contents import CheckpointContents
from rlkit.controller import Dispatch, register
from rlkit.debug.anomaly import check_gradients, check_tensor
from rlkit.protocol import Batch
from rlkit.utils.memory_peak import note, tensor_gb
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.micro_batch import MicroBatching, loss_scales

#: One micro-batch -> (its loss, aggregated over its own rows by the plan's loss_agg_mode; metrics to record).
MicroLoss = Callable[[Batch], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class UpdatePlan:
    """How one update call walks its (this rank's) batch."""

    epochs: int
    mini_batch_rows: int  # rows of this rank per optimizer step
    micro: MicroBatching  # forward/backward calls per mini-batch: by rows or by a token budget
    loss_agg_mode: str  # how the loss averages: sets the micro-batch weights (`loss_scales`)
    grad_clip: float
    shuffle_seed: int | None = None  # reshuffle the rows every epoch with this seed; None = keep their order
    optimizer_offload: bool = False  # optimizer state lives on the host between updates


class TrainableModelRole:
    """Mixin for a Worker that owns `self.model: FSDPModel` with an optimizer and an LR schedule."""

    model: FSDPModel
    checkpoint_contents: CheckpointContents = CheckpointContents()  # the role's section's `checkpoint` (actor, critic)

    def run_update(self, batch: Batch, plan: UpdatePlan, loss_fn: MicroLoss, prefix: str) -> dict[str, list[float]]:
        """The shared update loop (see the module docstring); returns the metrics, lists per micro-batch/step."""
        metrics: dict[str, list[float]] = defaultdict(list)
        if plan.optimizer_offload:
            self.model.load_optimizer()
        self.model.module.train()
        gen = torch.Generator().manual_seed(plan.shuffle_seed) if plan.shuffle_seed is not None else None
        for _epoch in range(plan.epochs):
            data = batch.index(torch.randperm(len(batch), generator=gen)) if gen is not None else batch
            for mini in data.split(plan.mini_batch_rows):
                micros = plan.micro.micro_batches(mini)
                scales = loss_scales([mb["response_mask"] for mb in micros], plan.loss_agg_mode)
                for mb, weight in zip(micros, scales):
                    loss, micro_metrics = loss_fn(mb)
                    check_tensor("loss", loss, mb, prefix)  # --debug nan (off: one cached lookup)
                    (loss * weight).backward()
                    check_gradients(self.model.module, mb, prefix)
                    for key, value in micro_metrics.items():
                        metrics[key].append(value)
                note(prefix, "grads_gb", tensor_gb(p.grad for p in self.model.trainable_parameters()))
                metrics[f"{prefix}/grad_norm"].append(self.model.clip_and_step(plan.grad_clip))
        if plan.optimizer_offload:
            self.model.offload_optimizer()
        self.note_memory(prefix)
        self.finish_update(metrics, prefix)
        return dict(metrics)

    def note_memory(self, prefix: str) -> None:
        """`memory/<prefix>/params_gb` and `optimizer_state_gb`: this rank's shards (grads: noted before each
        step, they are freed after it)."""
        note(prefix, "params_gb", tensor_gb(self.model.module.parameters()))
        state = self.model.optimizer.state.values() if self.model.optimizer is not None else []
        note(prefix, "optimizer_state_gb",
             tensor_gb(v for s in state for v in s.values() if isinstance(v, torch.Tensor)))

    def finish_update(self, metrics: dict[str, list[float]], prefix: str) -> None:
        """Record the LR this update used, then advance the schedule (once per update call)."""
        assert self.model.scheduler is not None, "init_model() sets up the optimizer and its schedule"
        metrics[f"{prefix}/lr"].append(self.model.scheduler.get_last_lr()[0])
        self.model.scheduler.step()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        keep = self.checkpoint_contents.save_contents  # verl's checkpoint.save_contents
        self.model.save(Path(path), with_optimizer="optimizer" in keep, with_scheduler="extra" in keep)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        c = self.checkpoint_contents  # verl's checkpoint.load_contents: what is left out starts fresh
        load = c.save_contents if c.load_contents is None else c.load_contents
        self.model.load(Path(path), with_optimizer="optimizer" in load, with_scheduler="extra" in load)
