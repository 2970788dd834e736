"""verl's R2 routing replay (actor.router_replay_from=old_log_prob): the old-log-prob pass captures the experts the
trainer's own routers chose, at each token's row and column, and the update replays them. Captured routes equal
the routers' choices (packed or padded, in a bf16-style bucketed row too), are -1 on padding, and replaying them
reproduces the forward bit for bit; the config maps verl's R2 and needs no route-returning engine."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.model_inputs import ModelInputs
from rlkit.workers.route_capture import positions, routes
from tests.workers.test_router_replay import R, moe_folders, rollout  # noqa: F401 (fixture)


def capture(model: FSDPModel, batch, remove_padding: bool, response_length: int = R) -> tuple[torch.Tensor, ...]:
    """(log-probs, captured routes (B, S, layers, k)) of one no-grad forward."""
    tap = model.router_tap
    ids, mask = batch["input_ids"], batch["attention_mask"]
    inputs = ModelInputs.of(ids, mask, batch["position_ids"]).with_extra(tap.POSITIONS,
                                                                        positions(*ids.shape, model.sp))
    with tap.capturing() as records, tap.recording(), torch.no_grad():
        out = model.forward(inputs, response_length=response_length, remove_padding=remove_padding)
    return out.log_probs, routes(records, mask, tap.top_k, model.sp)


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_captured_routes_are_the_routers_choices_at_their_tokens(moe_folders, remove_padding):  # noqa: F811
    model = FSDPModel(str(moe_folders[0]), FSDPConfig(), torch.device("cpu"))
    model.token_bucket = 8  # the packed row padded as bf16 pads it on CPU: padding tokens are routed, not recorded
    batch = rollout(moe_folders[0])
    plain, captured = capture(model, batch, remove_padding)
    mask = batch["attention_mask"].bool()
    own = torch.stack(model.router_tap.indices, dim=1)  # (valid tokens, layers, k), row-major
    assert captured.dtype == torch.int16 and captured.shape == (*mask.shape, len(model.router_tap.routers), 2)
    assert torch.equal(captured[mask].long(), own)
    assert (captured[~mask] == -1).all()
    with torch.no_grad():
        replayed = model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], R,
                                 remove_padding=not remove_padding, routed_experts=captured).log_probs
    assert torch.equal(replayed, plain) or torch.allclose(replayed, plain, atol=1e-6)


def test_verl_r2_maps_to_the_old_log_prob_routes_and_needs_no_route_returning_engine():
    from rlkit.trainer.run.run_config import load_config

    actor = load_config(None, ["actor_rollout_ref.actor.router_replay.mode=R2",
                               "actor_rollout_ref.rollout.name=vllm"]).actor_rollout_ref.actor
    assert actor.router_replay and actor.router_replay_from == "old_log_prob"
    r3 = load_config(None, ["actor_rollout_ref.actor.router_replay.mode=R3", "actor_rollout_ref.rollout.name=hf"])
    assert r3.actor_rollout_ref.actor.router_replay_from == "rollout"
