"""The update loop every trained role shares (`TrainableModelRole.run_update`), with a role-agnostic loss.

On a 1-rank gloo group in this process, like a worker runs it:
- micro-batches weighted by `loss_scales` add up to the whole mini-batch: one optimizer step of the loop
  (micro-batches by count or by a token budget) uses the gradient one backward on the whole batch gives
  (float32 on CPU, summed in a different order: within 1e-6 relative, measured ~1e-7);
- epochs x mini-batches optimizer steps, one LR step per call, rows visited in order or reshuffled
  each epoch by the seed (the same seed, the same order).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.protocol import Batch
from rlkit.testing import save_tiny_model
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.micro_batch import MicroBatching
from rlkit.workers.trainable import TrainableModelRole, UpdatePlan
from tests.perf.test_forward_equivalence import RESPONSE, handmade_batch


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2, tie_embeddings=True)


class Role(TrainableModelRole):
    """A trained role reduced to its model: what the loop needs."""

    def __init__(self, model: FSDPModel) -> None:
        self.model = model


def make_role(model_path, lr: float = 1e-2) -> Role:
    torch.manual_seed(0)
    model = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=lr, weight_decay=0.0), total_steps=10)
    return Role(model)


def pg_loss(role: Role, mode: str, seen: list | None = None):
    """-advantage x log-prob, aggregated by `mode`: the shape of any role's loss."""

    def fn(mb: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        if seen is not None:
            seen.append(mb["row"].tolist())
        out = role.model.forward(mb["input_ids"], mb["attention_mask"], mb["position_ids"], RESPONSE)
        loss = agg_loss(-mb["advantages"] * out.log_probs, mb["response_mask"].float(), mode)
        return loss, {"test/loss": float(loss.detach())}

    return fn


def batch_of(rows: int) -> Batch:
    parts = [handmade_batch(seed) for seed in range(-(-rows // 6))]
    batch = Batch({k: torch.cat([p[k] for p in parts])[:rows] for k in parts[0]})
    batch["row"] = torch.arange(rows)
    return batch


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("split", ["count", "tokens"])
def test_micro_batches_add_up_to_the_whole_mini_batch(process_group, model_path, mode, split):
    batch = batch_of(12)
    looped, whole = make_role(model_path), make_role(model_path)
    before = copy.deepcopy(whole.model.module.state_dict())
    plan = UpdatePlan(epochs=1, mini_batch_rows=12, micro=MicroBatching(5, split == "tokens", max_token_len=60),
                      loss_agg_mode=mode, grad_clip=1e9)
    metrics = looped.run_update(batch, plan, pg_loss(looped, mode), "test")
    micros = len(plan.micro.micro_batches(batch))
    assert micros > 1 and len(metrics["test/loss"]) == micros
    assert len(metrics["test/grad_norm"]) == 1 and metrics["test/lr"] == [1e-2]

    whole.model.module.train()
    loss, _ = pg_loss(whole, mode)(batch)
    loss.backward()
    assert whole.model.clip_and_step(1e9) == pytest.approx(metrics["test/grad_norm"][0], rel=1e-5)

    # AdamW's first moment after one step is (1 - beta1) x the gradient: compare the gradients the step used
    # (not the weights: Adam's first step moves every weight by ~lr whatever its gradient's size, so float
    # noise in a near-zero gradient entry shows as a full-size difference)
    grads = [torch.cat([s["exp_avg"].flatten() for s in role.model.optimizer.state.values()])
             for role in (looped, whole)]
    gap = float((grads[0] - grads[1]).norm() / grads[1].norm())
    print(f"{mode} {split}: gradient gap {gap:.1e}")
    assert grads[1].norm() > 0 and gap < 1e-6, f"loop vs whole batch: gradients differ by {gap:.2e}"
    moved = [torch.cat([(r.model.module.state_dict()[k] - before[k]).flatten() for k in before]).norm()
             for r in (looped, whole)]
    assert moved[0] == pytest.approx(float(moved[1]), rel=1e-3)  # and both stepped


def test_epochs_and_mini_batches_set_the_steps_and_the_row_order(process_group, model_path):
    batch = batch_of(12)

    def visited(shuffle_seed):
        role, seen = make_role(model_path, lr=1e-4), []
        plan = UpdatePlan(epochs=2, mini_batch_rows=4, micro=MicroBatching(2), loss_agg_mode="token-mean",
                          grad_clip=1.0, shuffle_seed=shuffle_seed)
        metrics = role.run_update(batch, plan, pg_loss(role, "token-mean", seen), "test")
        assert len(metrics["test/grad_norm"]) == 2 * 3  # epochs x mini-batches optimizer steps
        assert len(metrics["test/lr"]) == 1 and role.model.scheduler.last_epoch == 1  # one LR step per update
        rows = [r for mb in seen for r in mb]
        return rows[:12], rows[12:]

    first, second = visited(None)
    assert first == second == list(range(12))
    first, second = visited(7)
    assert sorted(first) == sorted(second) == list(range(12))
    assert first != second and first != list(range(12))  # reshuffled every epoch
    assert visited(7) == (first, second)  # by the seed
