"""MoE routing replay (actor.router_replay): the hf rollout records each token's experts, the trainer's forward
uses them. Replaying a model's own routes changes nothing (bit for bit); routes from another model are the ones
the routers use (checked through the tap), change the log-probs, and the router still gets gradients."""

from __future__ import annotations

import pytest
import torch

from rlkit.errors import UserError
from rlkit.models.moe_router import RouterTap
from rlkit.protocol import Batch
from rlkit.rollout import HFRollout, RolloutConfig
from rlkit.testing import MOE_FAMILIES, build_tiny_moe
from rlkit.workers.fsdp_model import FSDPModel
from tests.rollout.helpers import make_prompts

R = 6
TEXTS = ["1", "copy the digits : 1 2 3 4 5 6 7 8 9", "2 + 2 =", "reverse", "a b c"]


def own_routes(model, tap, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, routes (tokens, layers, k)) of a plain forward."""
    with tap.recording(), torch.no_grad():
        logits = model(**inputs).logits
    return logits, torch.stack(tap.indices, dim=1)


def perturb_routers(model, scale: float = 3.0, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in RouterTap.attach(model).routers:
            router.weight.add_(scale * router.weight.std() * torch.randn(router.weight.shape, generator=gen))


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_replaying_own_routes_is_exact_and_other_routes_are_used(family):
    model, _ = build_tiny_moe(family, sharpen=1.0)
    tap = RouterTap.attach(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    logits, routes = own_routes(model, tap, input_ids=ids)
    tap.replay(routes)
    with tap.recording(), torch.no_grad():
        replayed = model(input_ids=ids).logits
    assert torch.equal(replayed, logits)

    other, _ = build_tiny_moe(family, sharpen=1.0)
    perturb_routers(other)
    _, foreign = own_routes(other, RouterTap.attach(other), input_ids=ids)
    assert not torch.equal(foreign, routes)
    foreign[3] = -1  # a token without a recorded route keeps its own
    tap.replay(foreign)
    with tap.recording(), torch.no_grad():
        forced = model(input_ids=ids).logits
    used = torch.stack(tap.indices, dim=1)
    assert torch.equal(used[3], routes[3]) and torch.equal(
        torch.cat([used[:3], used[4:]]), torch.cat([foreign[:3], foreign[4:]])
    )
    assert not torch.allclose(forced, logits)
    _, after = own_routes(model, tap, input_ids=ids)  # the replay lasted one forward
    assert torch.equal(after, routes)


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_gradients_reach_the_router_under_replay(family):
    model, _ = build_tiny_moe(family, sharpen=1.0)
    tap = RouterTap.attach(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(2))
    routes = torch.randint(0, tap.num_experts, (7, len(tap.routers), 1)).repeat(1, 1, tap.top_k)
    routes[..., 1] = (routes[..., 0] + 1) % tap.num_experts  # k distinct experts per token
    tap.replay(routes)
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in tap.routers)


def test_a_router_without_a_scoring_rule_is_refused():
    model, _ = build_tiny_moe("qwen3_moe", sharpen=1.0)
    tap = RouterTap.attach(model)
    router = tap.routers[0]
    router.__class__ = type("MysteryTopKRouter", (type(router),), {})
    with pytest.raises(UserError, match="MysteryTopKRouter"):
        tap.replay(torch.zeros(3, len(tap.routers), tap.top_k, dtype=torch.long))


@pytest.fixture(scope="module")
def moe_folders(tmp_path_factory):
    """The tiny Qwen3-MoE, and a copy whose routers were perturbed (routes from "another" engine)."""
    root = tmp_path_factory.mktemp("replay")
    model, tokenizer = build_tiny_moe("qwen3_moe", sharpen=1.0)
    model.save_pretrained(root / "moe")
    tokenizer.save_pretrained(root / "moe")
    perturb_routers(model)
    model.save_pretrained(root / "perturbed")
    tokenizer.save_pretrained(root / "perturbed")
    return root / "moe", root / "perturbed"


def rollout(folder) -> Batch:
    """Sampled responses with their routes, in two micro-batches of uneven left padding."""
    config = RolloutConfig(prompt_length=32, response_length=R, max_num_seqs=3, seed=3)
    sampling = config.to_sampling()
    sampling.return_routed_experts = True
    return HFRollout(folder, config).generate(make_prompts(TEXTS), sampling)


def trainer_log_probs(model: FSDPModel, batch: Batch, remove_padding: bool, routes=None) -> torch.Tensor:
    with model.router_tap.recording(), torch.no_grad():
        out = model.forward(
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            R,
            remove_padding=remove_padding,
            routed_experts=routes,
        )
    return out.log_probs


def test_hf_rollout_records_routes_aligned_with_input_ids(moe_folders):
    out = rollout(moe_folders[0])
    routes = out["routed_experts"]
    rows, prompt_len = out["prompts"].shape
    assert routes.shape == (rows, prompt_len + R, 2, 2) and routes.dtype == torch.int16
    mask = out["attention_mask"].bool()
    assert (routes[~mask] == -1).all()  # padding (prompt and response) has no route
    last = out["response_mask"].sum(1) - 1 + prompt_len  # fed back only if its micro-batch generated on
    assert (routes[torch.arange(rows), last] == -1).any()
    fed = mask.clone()
    fed[torch.arange(rows), last] = False
    assert (routes[fed] >= 0).all() and (routes[fed] < 8).all()  # build_tiny_moe: 8 experts


def teacher_forced_routes(folder, batch: Batch) -> torch.Tensor:
    """(B, S, layers, k) routes another model chooses for `batch`'s tokens (-1 on padding)."""
    from rlkit.config.schema import FSDPConfig

    other = FSDPModel(str(folder), FSDPConfig(), torch.device("cpu"))
    trainer_log_probs(other, batch, remove_padding=True)
    mask = batch["attention_mask"].bool()
    chosen = torch.stack(other.router_tap.indices, dim=1)  # (valid tokens, layers, k)
    routes = torch.full((*mask.shape, *chosen.shape[1:]), -1, dtype=torch.int16)
    routes[mask] = chosen.to(torch.int16)
    return routes


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_trainer_replays_the_rollout_routes(moe_folders, process_group, remove_padding):
    """Same weights: the rollout's routes are the trainer's own, and replaying them gives identical log-probs.
    Routes another model chose for the same tokens: the trainer's routers use exactly those (FSDP2-wrapped, packed
    or padded), and the log-probs move."""
    from rlkit.config.schema import FSDPConfig

    model = FSDPModel(str(moe_folders[0]), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    out = rollout(moe_folders[0])
    plain = trainer_log_probs(model, out, remove_padding)
    mask = out["attention_mask"].bool()
    own = torch.stack(model.router_tap.indices, dim=1)  # (valid tokens, layers, k), row-major over (row, column)
    given = out["routed_experts"][mask].long()
    has = given[:, 0, 0] >= 0
    assert torch.equal(own[has], given[has])
    replayed = trainer_log_probs(model, out, remove_padding, out["routed_experts"])
    assert torch.equal(replayed, plain)

    foreign = teacher_forced_routes(moe_folders[1], out)
    assert not torch.equal(foreign[mask].long(), own)
    forced = trainer_log_probs(model, out, remove_padding, foreign)
    assert torch.equal(torch.stack(model.router_tap.indices, dim=1), foreign[mask].long())
    assert not torch.allclose(forced, plain)


def test_activation_checkpointing_recomputes_with_the_replayed_routes(moe_folders):
    """The backward recomputes each layer; its routers must see the replayed routes again (else the gradients
    would belong to other experts than the forward's)."""
    from rlkit.config.schema import FSDPConfig

    out = rollout(moe_folders[0])
    foreign = teacher_forced_routes(moe_folders[1], out)
    grads = []
    for checkpointing in (False, True):
        model = FSDPModel(str(moe_folders[0]), FSDPConfig(), torch.device("cpu"), gradient_checkpointing=checkpointing)
        model.module.train()
        lp = model.forward(
            out["input_ids"], out["attention_mask"], out["position_ids"], R, routed_experts=foreign
        ).log_probs
        (lp * out["response_mask"]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("gate" in n for n in grads[0])
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor_rollout_ref.rollout.name=vllm"], "backend does not return them"),
        (["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.multi_turn.enable=true"],
         "agent loop does not record routes"),
    ],
)
def test_router_replay_config_errors_name_the_key(overrides, message):
    """Refused when the config is loaded, not at the first rollout."""
    from rlkit.errors import UserError
    from rlkit.trainer.run.run_config import load_config

    with pytest.raises(UserError, match=message):
        load_config("grpo", ["actor_rollout_ref.actor.router_replay=true", *overrides])
    load_config("grpo", ["actor_rollout_ref.actor.router_replay=true", "actor_rollout_ref.rollout.name=hf"])
