"""verl's `fsdp_config.fsdp_size` (hybrid sharding, HSDP) trains exactly as one FSDP group over every worker.

Real gloo ranks, each with its own rows of one handmade rollout batch (different token counts per rank).
Every rank builds the same tiny model with the default sharding (fsdp_size=-1) and with HSDP, takes two
AdamW steps of a token-mean policy loss on its rows (weighted by `loss_scales`, as the update loop does),
and compares: the grad norms (1e-5 relative) and `full_state_dict` (the weights the rollout engine
receives) against the default's and against one process on the whole batch (the parent, before the ranks
start). Bound: 1e-5 absolute per element in float32 (elements move ~2e-3 at lr 1e-3; the layouts sum the
same gradients in another order). Measured: world 2, fsdp_size=1: 0 vs the default, 3.8e-6 vs one process
(the default's own distance); world 4, fsdp_size=1 and 2: 1.5e-7 vs the default, 1.2e-6 vs one process.
The DCP checkpoint of an HSDP model loads exactly into an HSDP model and into a default one (the checkpoint
is layout-free). On 4 ranks (slow) also LoRA (the adapter trained; measured 2e-8) and Ulysses sequence
parallelism (its own groups; the gradient is still the world's average; measured 4e-7) under HSDP.
Config time: a size that does not divide the workers is refused with the key's name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.config.schema import FSDPConfig, ModelConfig, OptimConfig
from rlkit.errors import UserError
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.workers.test_varlen_attention import handmade_batch

R, ROWS, STEPS, TOL = 7, 12, 2, 1e-5
LORA = ModelConfig(lora_rank=4, lora_alpha=8)


def rows_of(rank: int, world: int) -> dict[str, torch.Tensor]:
    """Rank r's rows of the global batch (world 1: all of them); rank 0 holds twice rank 1's tokens."""
    full = handmade_batch(rows=ROWS, prompt=10, response=R, seed=3)
    bounds = {1: [0, ROWS], 2: [0, 8, ROWS], 4: [0, 5, 8, 10, ROWS]}[world]
    own = slice(bounds[rank], bounds[rank + 1])
    return {k: v[own] for k, v in full.items()}


def train(model, batch: dict) -> list[float]:
    """STEPS optimizer steps on this rank's rows; the grad norm of each."""
    from rlkit.workers.micro_batch import loss_scales

    model.setup_optimizer(OptimConfig(lr=1e-3, weight_decay=0.0), total_steps=STEPS)
    norms = []
    for _ in range(STEPS):
        out = model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], R)
        mask = batch["response_mask"].float()
        scale = loss_scales([batch["response_mask"]], "token-mean")[0]
        (scale * agg_loss(-batch["advantages"] * out.log_probs, mask)).backward()
        norms.append(model.clip_and_step(1.0))
    return norms


def build(path: str, fsdp_size: int = -1, **kw):
    from rlkit.workers.fsdp_model import FSDPModel

    torch.manual_seed(0)
    return FSDPModel(path, FSDPConfig(fsdp_size=fsdp_size), torch.device("cpu"), **kw)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _worker(rank: int, store_path: str, payload: dict, results) -> None:
    world, sizes = payload["world"], payload["sizes"]
    with gloo_rank(rank, store_path, results, world=world):
        path, batch = payload["model"], rows_of(rank, world)
        single = torch.load(payload["single"])
        default = build(path)
        default_norms = train(default, batch)
        want = default.full_state_dict()
        assert max_diff(want, single["weights"]) <= TOL, f"default vs one process: {max_diff(want, single['weights'])}"
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(default_norms, single["norms"]))
        found: dict = {}
        for size in sizes:
            hsdp = build(path, size)
            mesh = next(hsdp.module.parameters()).device_mesh
            assert mesh.shape == (world // size, size), mesh
            norms = train(hsdp, batch)
            assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(norms, default_norms)), (norms, default_norms)
            got = hsdp.full_state_dict()
            found[f"fsdp_size={size}"] = (max_diff(got, want), max_diff(got, single["weights"]))
            assert max(found[f"fsdp_size={size}"]) <= TOL, found
        # checkpoint round trip: HSDP -> HSDP, HSDP -> one group
        ckpt = Path(payload["ckpt"])
        hsdp.save(ckpt)
        for target in (build(path, sizes[-1]), build(path)):
            target.setup_optimizer(OptimConfig(lr=1e-3, weight_decay=0.0), total_steps=STEPS)
            target.load(ckpt)
            assert max_diff(target.full_state_dict(), got) == 0.0
        if payload["extras"]:
            extras(path, batch, sizes, want, found)
        if rank == 0:
            print(f"HSDP world={world} max |diff| (vs default, vs one process):", found)


def extras(path: str, batch: dict, sizes: list[int], want: dict, found: dict) -> None:
    """LoRA (the adapter trained, the base frozen) and Ulysses SP (groups of 2 consecutive ranks beside HSDP's
    own groups) under HSDP: the same weights as the default sharding."""
    lora_want = build(path, lora=LORA)
    train(lora_want, batch)
    lora_want = lora_want.full_state_dict()
    for size in sizes:
        lora = build(path, size, lora=LORA)
        train(lora, batch)
        found[f"lora, fsdp_size={size}"] = max_diff(lora.full_state_dict(), lora_want)
        sp = build(path, size, ulysses_sequence_parallel_size=2)
        train(sp, batch)
        found[f"ulysses, fsdp_size={size}"] = max_diff(sp.full_state_dict(), want)
    assert max(v for k, v in found.items() if k.startswith(("lora", "ulysses"))) <= TOL, found


@pytest.fixture(scope="module")
def model_and_single(tmp_path_factory) -> tuple[str, str]:
    """The tiny model and the weights one process gets on the whole batch (no process group)."""
    from rlkit.testing import save_tiny_model

    root = tmp_path_factory.mktemp("hsdp")
    path = str(save_tiny_model(root / "tiny", heads=4, tie_embeddings=True))
    one = build(path)
    norms = train(one, rows_of(0, 1))
    torch.save({"weights": one.full_state_dict(), "norms": norms}, root / "single.pt")
    return path, str(root / "single.pt")


def test_hsdp_two_replicas_of_one_shard_equal_full_sharding(model_and_single, tmp_path):
    path, single = model_and_single
    payload = dict(world=2, sizes=[1], model=path, single=single, ckpt=str(tmp_path / "ckpt"), extras=False)
    run_on_gloo_workers(_worker, payload, tmp_path, world=2, timeout_s=300)


@pytest.mark.slow
def test_hsdp_on_four_workers(model_and_single, tmp_path):
    """4 replicas x 1 shard and 2 x 2 on 4 gloo ranks; LoRA and Ulysses SP under HSDP."""
    path, single = model_and_single
    payload = dict(world=4, sizes=[1, 2], model=path, single=single, ckpt=str(tmp_path / "ckpt"), extras=True)
    run_on_gloo_workers(_worker, payload, tmp_path, world=4)


def test_config_refuses_a_size_that_does_not_divide_the_workers(toy_data, tmp_path):
    from rlkit.trainer.run.run_config import load_config
    from tests.trainer.conftest import toy_overrides

    base = toy_overrides(toy_data, str(tmp_path / "unused-model"), tmp_path, trainer__n_gpus_per_node=4)
    cfg = load_config("grpo", [*base, "actor_rollout_ref.actor.fsdp_config.fsdp_size=1", "critic.fsdp.fsdp_size=2",
                               "actor_rollout_ref.ref.fsdp_config.fsdp_size=8"])  # >= the workers: one group
    assert cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size == 1 and cfg.critic.fsdp_config.fsdp_size == 2
    for key in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config"):
        with pytest.raises(UserError, match=f"{key}.fsdp_size=3 must divide the 4 workers"):
            load_config("grpo", [*base, f"{key}.fsdp_size=3"])
    with pytest.raises(UserError, match="critic.fsdp_config.fsdp_size=3 must divide the 4 workers"):
        load_config("ppo", [*base, "critic.model.fsdp_config.fsdp_size=3"])  # verl's older critic layout
    with pytest.raises(UserError, match="fsdp_config.fsdp_size=0: use -1"):
        load_config("grpo", [*base, "actor_rollout_ref.actor.fsdp_config.fsdp_size=0"])
    from rlkit.workers.parallel_layout import ParallelLayout

    for size in (-1, 4, 8):  # as in verl: one FSDP group over the 4 workers, no mesh
        assert ParallelLayout.of(size, world=4).fsdp_mesh(torch.device("cpu")) is None
