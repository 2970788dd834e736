"""The rank-0 load (issue 49 defect 6, rlkit/workers/model_load.py): rank 0 reads the checkpoint, the other ranks
build the model on the meta device and receive their shards from rank 0 after FSDP2 wraps it.

Two real gloo ranks (FSDP2, float32, the tiny tied-embedding model): the per-rank load and the rank-0 load give
bitwise the same log-probs, the same full weights and buffers (rotary `inv_freq` is not in the state dict), and
after two AdamW steps the same grad norms and weights (a broken tie between the embedding and the LM head would
move them apart); LoRA the same; a critic's values (its value head is not in the checkpoint) the same; bf16 compute
from a bf16 checkpoint, the same dithered masters (rlkit/workers/master_dither.py). Rank 1 is
given a copy of the model folder without its weight file, so the test fails if it ever reads the weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rlkit.config.schema import FSDPConfig
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.model_load import RANK0_LOAD_ENV, rank0_load_wanted
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.workers.test_hsdp import LORA, R, build, max_diff, rows_of, train


def _both_ways(path: str, blind: str, rank: int, monkeypatch_env, **kw) -> dict:
    """Log-probs, weights, buffers, grad norms and trained weights of the per-rank load and the rank-0 load."""
    batch = rows_of(rank, 2)
    got = {}
    for mode in ("0", "1"):
        monkeypatch_env(mode)
        model = build(path if mode == "0" or rank == 0 else blind, **kw)
        with torch.no_grad():
            logp = model.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], R).log_probs
        got[mode] = dict(logp=logp, weights=model.full_state_dict(),
                         buffers={k: v.clone() for k, v in model.module.named_buffers()})
        got[mode]["norms"] = train(model, batch)
        got[mode]["trained"] = model.full_state_dict()
    return got


def _worker(rank: int, store_path: str, payload: dict, results) -> None:
    import os

    def env(mode: str) -> None:
        os.environ[RANK0_LOAD_ENV] = mode

    with gloo_rank(rank, store_path, results):
        for kw in ({}, {"lora": LORA}):
            got = _both_ways(payload["model"], payload["blind"], rank, env, **kw)
            full, rank0 = got["0"], got["1"]
            assert torch.equal(full["logp"], rank0["logp"]), (kw, (full["logp"] - rank0["logp"]).abs().max())
            assert max_diff(full["weights"], rank0["weights"]) == 0.0, kw
            assert full["buffers"].keys() == rank0["buffers"].keys() and any("inv_freq" in k for k in full["buffers"])
            assert all(torch.equal(full["buffers"][k], rank0["buffers"][k]) for k in full["buffers"]), kw
            assert full["norms"] == rank0["norms"], (kw, full["norms"], rank0["norms"])
            assert max_diff(full["trained"], rank0["trained"]) == 0.0, kw
            assert max_diff(full["trained"], full["weights"]) > 0.0  # the steps moved something
        values = {}  # a critic: its value head is new (not in the checkpoint), rank 0's initial one reaches rank 1
        for mode in ("0", "1"):
            env(mode)
            critic = build(payload["model"] if mode == "0" or rank == 0 else payload["blind"], value_head=True)
            batch = rows_of(rank, 2)
            with torch.no_grad():
                values[mode] = critic.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                              R).values
        assert torch.equal(values["0"], values["1"]), (values["0"] - values["1"]).abs().max()
        masters = {}  # bf16 compute from a bf16 checkpoint: the masters are dithered (rank 0's reach rank 1)
        for mode in ("0", "1"):
            env(mode)
            torch.manual_seed(0)
            model = FSDPModel(payload["bf16"] if mode == "0" or rank == 0 else payload["bf16_blind"],
                              FSDPConfig(param_dtype="bfloat16"), torch.device("cpu"))
            masters[mode] = model.full_state_dict()
        assert max_diff(masters["0"], masters["1"]) == 0.0
        assert any(not torch.equal(v, v.bfloat16().float()) for v in masters["1"].values())  # dithered off the grid


def _blind_copy(path: Path, to: Path) -> str:
    """A copy of the model folder without its weight file (rank 1's)."""
    blind = shutil.copytree(path, to)
    weights = list(blind.glob("*.safetensors"))
    assert weights
    for f in weights:
        f.unlink()
    return str(blind)


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory) -> tuple[str, str]:
    """The tiny tied-embedding model, and its blind copy."""
    from rlkit.testing import save_tiny_model

    root = tmp_path_factory.mktemp("rank0")
    path = save_tiny_model(root / "tiny", heads=4, tie_embeddings=True)
    return str(path), _blind_copy(path, root / "blind")


@pytest.mark.slow  # ~2 min on a loaded 2-core machine: four builds and trainings per rank
def test_rank0_load_equals_the_per_rank_load(tied_model, tmp_path):
    from rlkit.testing import save_tiny_model

    path, blind = tied_model
    bf16 = save_tiny_model(tmp_path / "bf16", heads=4, dtype="bfloat16")
    payload = dict(model=path, blind=blind, bf16=str(bf16), bf16_blind=_blind_copy(bf16, tmp_path / "bf16_blind"))
    run_on_gloo_workers(_worker, payload, tmp_path, world=2, timeout_s=300)


def test_rank1_cannot_load_without_the_weights(tied_model):
    """The blind folder really has no weights: a per-rank load from it fails (so the test above proves rank 1
    never read them)."""
    from transformers import AutoModelForCausalLM

    with pytest.raises(OSError):
        AutoModelForCausalLM.from_pretrained(tied_model[1])


@pytest.mark.parametrize("device, world, env, want", [
    ("cuda", 8, "", True), ("cuda", 1, "", False), ("cpu", 2, "", False), ("cpu", 2, "1", True),
    ("cuda", 8, "0", False), ("cpu", 1, "1", False),
])
def test_when_rank0_loads(monkeypatch, device, world, env, want):
    monkeypatch.setenv(RANK0_LOAD_ENV, env)
    assert rank0_load_wanted(torch.device(device), world) is want


def test_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv(RANK0_LOAD_ENV, "yes")
    with pytest.raises(ValueError, match=RANK0_LOAD_ENV):
        rank0_load_wanted(torch.device("cuda"), 2)
