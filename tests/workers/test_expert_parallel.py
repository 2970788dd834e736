"""Expert parallel (DTensor, `fsdp_config.expert_parallel_size`) computes what the same ranks compute without it.

Two gloo ranks, each with its own micro-batch of one handmade rollout batch (different row and token counts), build
the same tiny MoE twice: FSDP2 over both (ep=1) and with the experts split over an EP group of both ranks (ep=2,
rlkit/workers/expert_parallel.py: tokens dispatched to their experts' rank by all-to-all, FSDP2 over the ranks
holding the same experts), gradient checkpointing on (the recomputed forward dispatches again). For the packed and
the padded forward, one micro-batch step of a policy loss plus the router load-balancing loss (as the actor adds it):
this rank's log-probs, loss, load-balancing loss and expert-load metrics, and every parameter's full gradient, equal
the ep=1 model's; so do they with routing replay (given routes), and so do the grad norm and the weights after two
AdamW steps (what the rollout engine receives). Checkpoints: a DCP save at ep=2 loads exactly at ep=1 and an ep=1
save at ep=2; `rlkit export` of the ep=2 checkpoint is the plain HF folder of the same weights (the per-expert
names vLLM loads are made from it as from any other, rlkit/models/weight_layout.py).
Also tp=2 alone on the MoE (its TP plan: router and experts whole over the group, each rank's router load kept to
its own tokens, Qwen3's per-head q/k norms), and, slow, four ranks: ep 2 x tp 2 (shard 2 x ep 2, HSDP x ep 2, ep 2
x tp 2 without sequence parallel and Ulysses sp 2 x ep 2 were run the same way, outside the suite's time budget).
Bound (float32): 1e-5 absolute on log-probs, gradients, weights; loss and aux loss 1e-6 relative (under TP: the
ranks' mean, each rank's loss holding its group's mean load-balancing loss); metrics equal; checkpoints and export
exact. Measured, max over families, paths, layouts and ranks (printed by rank 0): log-probs 9.5e-7, gradients
2.2e-7, loss 3.6e-7 relative, aux loss 1.2e-7 relative, grad norm 1.1e-7 relative, weights after two AdamW steps
(lr 1e-4) 1.5e-6; routing replay's log-probs equal at ep=2 without TP.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlkit.config.schema import FSDPConfig, OptimConfig
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.workers.test_tensor_parallel import full_grads, max_diff, rows_of

R, TOL, AUX_COEF = 7, 1e-5, 0.01
PATHS = {"packed": dict(), "padded": dict(remove_padding=False)}


def build(path: str, ep: int = 1, tp: int = 1, fsdp_size: int = -1, sp: int = 1, seq_par: bool = True):
    from rlkit.workers.fsdp_model import FSDPModel

    config = FSDPConfig(param_dtype="float32", expert_parallel_size=ep, tensor_parallel_size=tp, fsdp_size=fsdp_size,
                        sequence_parallel=seq_par)
    return FSDPModel(path, config, torch.device("cpu"), gradient_checkpointing=True, ulysses_sequence_parallel_size=sp)


def aux_step(model, batch: dict, **kw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """The actor's micro-batch with the router load-balancing loss: (log-probs, loss, aux loss, load metrics)."""
    from rlkit.algo.loss_agg import agg_loss
    from rlkit.workers.micro_batch import loss_scales

    model.module.zero_grad(set_to_none=True)
    tap = model.router_tap
    with tap.recording():
        out = model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], R,
                            temperature=0.7, **kw)
        aux = tap.load_balancing_loss()
        metrics = tap.load_metrics()
    mask = batch["response_mask"].float()
    scale = loss_scales([batch["response_mask"]], "token-mean")[0]
    loss = scale * agg_loss(-batch["advantages"] * out.log_probs, mask) + AUX_COEF * aux
    loss.backward()
    return out.log_probs.detach(), loss.detach(), aux.detach(), metrics


def compare(base, split, batch: dict, found: dict, tag: str, **kw) -> torch.Tensor:
    """One `aux_step` of each model, compared; returns the ep=1 log-probs."""
    valid = batch["response_mask"].bool()
    want, got = aux_step(base, batch, **kw), aux_step(split, batch, **kw)
    # under TP each rank's loss holds its group's mean load-balancing loss: the ranks' mean is what matches
    rel = [abs(float(world_mean(g) - world_mean(w))) / max(1.0, abs(float(world_mean(w))))
           for g, w in zip(got[1:3], want[1:3])]
    found[tag] = dict(log_probs=float((got[0] - want[0])[valid].abs().max()), loss_rel=rel[0], aux_rel=rel[1],
                      grads=max_diff(full_grads(split), full_grads(base)))
    assert got[3] == want[3] and got[3], (got[3], want[3])
    assert found[tag]["log_probs"] <= TOL and found[tag]["grads"] <= TOL and max(rel) <= 1e-6, found[tag]
    return want[0]


def world_mean(value: torch.Tensor) -> torch.Tensor:
    total = value.clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def given_routes(batch: dict, layers: int, experts: int, top_k: int, seed: int) -> torch.Tensor:
    """(rows, tokens, layers, k) distinct experts per token, some tokens (-1) keeping the router's own choice."""
    rows, tokens = batch["input_ids"].shape
    g = torch.Generator().manual_seed(seed)
    routes = torch.rand(rows, tokens, layers, experts, generator=g).argsort(-1)[..., :top_k]
    routes[:, ::3] = -1
    return routes


def _worker(rank: int, store_path: str, payload: dict, results) -> None:
    from rlkit.workers.hf_export import export_hf
    from rlkit.workers.parallel_layout import ParallelLayout

    ckpt, world = Path(payload["ckpt"]), payload["world"]
    ep, tp, fsdp_size, sp, seq_par = (*payload["layout"], 1, True)[:5]  # sp: the baseline is Ulysses at that sp
    with gloo_rank(rank, store_path, results, world=world):
        batch = rows_of(rank, world)
        found: dict = {}
        path = payload["model"]
        base, split = build(path, sp=sp), build(path, ep, tp, fsdp_size, sp, seq_par)
        layout = ParallelLayout.of(fsdp_size, sp, world=world, tp=tp, ep=ep)
        assert split.layout == layout and (split.tp is not None) == (tp > 1) and (split.ep is not None) == (ep > 1)
        if split.ep is not None:
            experts = split.ep.modules[0]
            local = experts.gate_up_proj.to_local()
            weight = experts.gate_up_proj  # its experts split over ep, then sharded by FSDP2 over the shard / ep
            assert weight.placements[weight.device_mesh.mesh_dim_names.index("ep")].is_shard(0), weight.placements
            assert weight.shape[0] == experts.num_experts == layout.shard * local.shape[0]
        for model in (base, split):
            model.setup_optimizer(OptimConfig(lr=1e-4, weight_decay=0.0), total_steps=3)
        own = [compare(base, split, batch, found, name, **kw) for name, kw in PATHS.items()][0]
        tap = base.router_tap
        routes = given_routes(batch, len(tap.routers), tap.num_experts, tap.top_k, seed=rank)
        replayed = compare(base, split, batch, found, "routing replay", routed_experts=routes)
        assert not torch.allclose(replayed, own), "the given routes changed nothing"  # they were used
        norms = []
        for _ in range(2):
            aux_step(base, batch), aux_step(split, batch)
            norms.append((base.clip_and_step(1.0), split.clip_and_step(1.0)))
        found["grad_norm_rel"] = max(abs(a - b) / abs(a) for a, b in norms)
        found["weights"] = max_diff(split.full_state_dict(), base.full_state_dict())
        assert found["grad_norm_rel"] <= 1e-5 and found["weights"] <= TOL, found
        for saved, to, name in ((split, (1, 1, -1, sp), "split"), (base, (ep, tp, fsdp_size, sp, seq_par), "base")):
            folder = ckpt / f"saved_by_{name}"  # DCP checkpoints cross the layouts
            saved.save(folder)
            loaded = build(path, *to)
            loaded.setup_optimizer(OptimConfig(lr=1e-4, weight_decay=0.0), total_steps=2)
            loaded.load(folder)
            found[f"checkpoint of the {name} model loaded at ep, tp={to[:2]}"] = got = max_diff(
                loaded.full_state_dict(), saved.full_state_dict())
            assert got == 0.0, found
        want = split.full_state_dict()
        dist.barrier()
        if rank == 0:  # `rlkit export` of the ep=2 checkpoint: the plain HF folder (per-expert names on disk)
            from transformers import AutoModelForCausalLM

            out = export_hf(ckpt / "saved_by_split", ckpt / "hf")
            exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
            found["export"] = max_diff(exported, want)
            assert found["export"] == 0.0, found
        dist.barrier()
        gathered = [None] * world
        dist.all_gather_object(gathered, found)
        if rank == 0:
            for key in found:
                print(key, {r: gathered[r].get(key) for r in range(world)})


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    from rlkit.testing import save_tiny_moe

    root = tmp_path_factory.mktemp("ep-models")
    models = {family: str(save_tiny_moe(root / family, family, sharpen=1.0)) for family in ("qwen3_moe", "mixtral")}
    models["qwen3_moe/tp"] = str(save_tiny_moe(root / "qwen3_moe_tp", "qwen3_moe", sharpen=1.0, kv_heads=2))
    return models


@pytest.mark.parametrize(("family", "layout"), [("qwen3_moe", (2, 1, -1)), ("mixtral", (2, 1, -1)),
                                                ("qwen3_moe/tp", (1, 2, -1))], ids=["qwen3_moe", "mixtral", "tp2"])
def test_ep2_matches_ep1_on_two_gloo_workers(moe_models, family, layout, tmp_path):
    """ep 2 for both families; and tp 2 (the MoE TP plan: router and experts whole over the group, each rank's
    router load kept to its own tokens, Qwen3's per-head q/k norms)."""
    payload = dict(model=moe_models[family], ckpt=str(tmp_path / "ckpt"), world=2, layout=layout)
    run_on_gloo_workers(_worker, payload, tmp_path, world=2)


@pytest.mark.slow
# shard 2 x ep 2, ep2 x tp2 without sequence parallel, HSDP replicate 2 x ep 2 and Ulysses sp 2 x ep 2 ran too (the
# same bounds, docs/parallelism.md); the suite keeps this one for its time budget
@pytest.mark.parametrize("layout", [(2, 2, -1)], ids=["ep2xtp2"])
def test_ep2_on_four_gloo_workers(moe_models, layout, tmp_path):
    """ep 2 x tp 2: EP groups of the ranks with the same TP index ({0, 2}, {1, 3}), each TP group running the router
    and experts whole on its gathered rows (rlkit/workers/tp_plans.py's MoE plan), with and without TP's sequence
    parallel; shard 2 x ep 2: the experts'
    FSDP2 unit reduces over 2 ranks and divides by 4; HSDP (fsdp_size 2): replicate 2 x ep 2; Ulysses sp 2 x ep 2
    against Ulysses sp 2 alone (each rank's routers see its slice of the group's packed row)."""
    payload = dict(model=moe_models["qwen3_moe/tp"], ckpt=str(tmp_path / "ckpt"), world=4, layout=layout)
    run_on_gloo_workers(_worker, payload, tmp_path, world=4)


def test_config_sizes_verl_keys_and_the_dry_run_mesh(toy_data, tmp_path):
    """`fsdp_config.expert_parallel_size` and verl's `megatron.expert_model_parallel_size` (with
    `tensor_model_parallel_size`) and VeOmni's `expert_parallel_size` reach the layout, the reference following the
    actor; sizes that do not divide the data-parallel workers, EP beside LoRA, EP on a dense model and EP not
    dividing the experts are refused with one line naming the key; the dry run shows each role's mesh."""
    import io

    from rich.console import Console

    from rlkit.errors import UserError
    from rlkit.testing import save_tiny_model, save_tiny_moe
    from rlkit.trainer.kinds.rl_launch import plan as resource_plan
    from rlkit.trainer.run.preflight import Preflight, check_expert_parallel_model, check_model
    from rlkit.trainer.run.run_config import load_config
    from tests.trainer.conftest import toy_overrides

    model = save_tiny_moe(tmp_path / "moe", "qwen3_moe", kv_heads=2)
    base = toy_overrides(toy_data, str(model), tmp_path, trainer__n_gpus_per_node=4)
    actor, ref = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
    cfg = load_config("grpo", [*base, f"{actor}.fsdp_config.expert_parallel_size=2", f"{actor}.use_kl_loss=true"])
    assert cfg.actor_rollout_ref.ref.fsdp_config.expert_parallel_size == 2  # the reference follows the actor
    console = Console(width=240, record=True, file=io.StringIO())
    console.print(resource_plan(cfg))
    plan = console.export_text()
    assert "actor mesh" in plan and "replicate 1 x shard 2 x ep 2 x tp 1 (4 workers)" in plan, plan
    assert "ref mesh" in plan, plan
    verl = load_config("grpo", [*base, f"{actor}.strategy=megatron", f"+{actor}.megatron.expert_model_parallel_size=2",
                                f"+{actor}.megatron.tensor_model_parallel_size=2",
                                f"+{actor}.megatron.expert_tensor_parallel_size=2"])
    fsdp = verl.actor_rollout_ref.actor.fsdp_config
    assert (fsdp.expert_parallel_size, fsdp.tensor_parallel_size) == (2, 2)
    console = Console(width=240, record=True, file=io.StringIO())
    console.print(resource_plan(verl))
    assert "replicate 1 x shard 1 x ep 2 x tp 2 (4 workers)" in console.export_text()
    veomni = load_config("grpo", [*base, f"+{actor}.veomni.expert_parallel_size=4"])
    assert veomni.actor_rollout_ref.actor.fsdp_config.expert_parallel_size == 4
    for override, message in [
        (f"{actor}.fsdp_config.expert_parallel_size=3", "expert_parallel_size=3 must divide the 4 data-parallel"),
        (f"{actor}.fsdp_config.tensor_parallel_size=4", "expert_parallel_size=2 must divide the 1 data-parallel"),
        (f"{actor}.fsdp_config.fsdp_size=1", "expert_parallel_size=2 must divide fsdp_size=1"),
        (f"{ref}.fsdp_config.expert_parallel_size=3", "ref.fsdp_config.expert_parallel_size=3 must divide"),
        (f"{actor}.fsdp_config.expert_parallel_size=0", "expert_parallel_size=0: use 1"),
        ("actor_rollout_ref.model.lora_rank=4", "expert_parallel_size > 1 with LoRA"),
    ]:
        with pytest.raises(UserError, match=message):
            load_config("grpo", [*base, f"{actor}.fsdp_config.expert_parallel_size=2", override])
    for folder, ep, problem in [
        (save_tiny_model(tmp_path / "dense", heads=4), 2, "expert_parallel_size=2 splits a mixture-of-experts"),
        (save_tiny_moe(tmp_path / "moe6", "mixtral", experts=6), 4, "must divide the model's 6 experts"),
    ]:
        overrides = toy_overrides(toy_data, str(folder), tmp_path, trainer__n_gpus_per_node=4)
        report = Preflight(load_config("grpo", [*overrides, f"{actor}.fsdp_config.expert_parallel_size={ep}"]), False)
        check_model(report)
        check_expert_parallel_model(report)
        assert any(problem in line for line in report.problems), report.problems


def test_layout_meshes_and_plan_refusals():
    from rlkit.errors import UserError
    from rlkit.workers.expert_parallel import EXPERT_PLANS
    from rlkit.workers.parallel_layout import ParallelLayout
    from rlkit.workers.tp_plans import TP_PLANS

    layout = ParallelLayout.of(-1, world=8, tp=2, ep=2)
    assert layout.mesh_shape == {"replicate": 1, "shard": 2, "ep": 2, "tp": 2} and layout.data_parallel == 4
    assert ParallelLayout.of(2, world=8, ep=2).describe() == "replicate 4 x shard 1 x ep 2 x tp 1"
    with pytest.raises(ValueError, match="expert_parallel_size=4 must divide the 2 ranks"):
        ParallelLayout.of(2, world=8, ep=4)
    assert ParallelLayout.of(-1, sp=2, world=8, ep=2).describe() == "replicate 1 x shard 4 x ep 2 x tp 1, Ulysses sp 2"
    for family in ("qwen3_moe", "mixtral", "qwen2_moe", "olmoe"):
        assert family in EXPERT_PLANS
    for family in ("qwen3_moe", "mixtral"):
        assert family in TP_PLANS
    with pytest.raises(UserError, match="expert-parallel plan"):
        EXPERT_PLANS.get("llama")
