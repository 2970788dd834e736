"""Compiled decoder layers (`model.use_torch_compile`, rlkit/workers/layer_compile.py) beside LoRA, MoE routing
replay and Ulysses sequence parallelism: each computes what its eager model computes.

- LoRA (rank 4, a random adapter, one bf16 worker: the compute copy): log-probs and the adapter's gradients.
- MoE routing replay (tiny Qwen3-MoE): the router tap's hooks still fire inside the compiled layers, replaying a
  model's own routes changes no log-prob, routes another model chose are the ones the routers use, and the
  log-probs move with them as they do eagerly.
- Ulysses SP=2 on two gloo workers: compiled and eager SP=2 models give the same log-probs, loss and gradients.
Tolerances: float32 1e-5 on log-probs and 1e-4 of the largest gradient (inductor fuses and reorders
elementwise work: measured ~1e-7); bf16 (LoRA) 2e-2, the rounding of one bf16 op in another order.
"""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig
from rlkit.workers.fsdp_model import FSDPModel
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.models.test_lora import LORA, randomize_adapter
from tests.models.test_lora import tiny as tiny  # noqa: F401  (fixture)
from tests.workers.test_cpu_bf16 import _batch
from tests.workers.test_router_replay import moe_folders as moe_folders  # noqa: F401  (fixture)
from tests.workers.test_router_replay import rollout, teacher_forced_routes, trainer_log_probs
from tests.workers.test_ulysses import model_paths as model_paths  # noqa: F401  (fixture)
from tests.workers.test_ulysses import rank_batch, step


def _grads(model: FSDPModel) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}


def test_compiled_lora_matches_eager(tiny):  # noqa: F811
    results = []
    for compiled in (False, True):
        model = FSDPModel(str(tiny), FSDPConfig(param_dtype="bfloat16"), torch.device("cpu"), lora=LORA,
                          compile_layers=compiled)
        randomize_adapter(model.module)
        out = model.forward(*_batch(), with_entropy=True)
        (-out.log_probs.mean() - 0.01 * out.entropy.mean()).backward()
        results.append((out.log_probs.detach(), _grads(model)))
    (want_lp, want), (got_lp, got) = results
    torch.testing.assert_close(got_lp, want_lp, atol=2e-2, rtol=0)
    assert want and got.keys() == want.keys() and all(".lora_" in n for n in want)  # the adapter alone trains
    scale = max(g.abs().max() for g in want.values())
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=2e-2 * scale, rtol=0, msg=name)


def test_compiled_moe_replays_routes_as_eager(moe_folders):  # noqa: F811
    out = rollout(moe_folders[0])
    foreign = teacher_forced_routes(moe_folders[1], out)
    mask = out["attention_mask"].bool()
    runs = {}
    for compiled in (False, True):
        model = FSDPModel(str(moe_folders[0]), FSDPConfig(), torch.device("cpu"), compile_layers=compiled)
        own = trainer_log_probs(model, out, remove_padding=True)
        assert model.router_tap.indices, "the router hooks did not fire"
        replayed = trainer_log_probs(model, out, True, out["routed_experts"])
        forced = trainer_log_probs(model, out, True, foreign)
        assert torch.equal(torch.stack(model.router_tap.indices, dim=1), foreign[mask].long())
        runs[compiled] = (own, replayed, forced)
    for eager, compiled in zip(runs[False], runs[True], strict=True):
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=0)
    own, replayed, forced = runs[True]
    torch.testing.assert_close(replayed, own, atol=1e-6, rtol=0)
    assert not torch.allclose(forced, own)


def _sp_compiled_worker(rank: int, store_path: str, path: str, results) -> None:
    with gloo_rank(rank, store_path, results):
        batch = rank_batch(rank)
        valid = batch["response_mask"].bool()
        cpu = torch.device("cpu")
        eager = FSDPModel(path, FSDPConfig(), cpu, ulysses_sequence_parallel_size=2)
        compiled = FSDPModel(path, FSDPConfig(), cpu, ulysses_sequence_parallel_size=2, compile_layers=True)
        a, b = step(eager, batch), step(compiled, batch)
        torch.testing.assert_close(b[0][valid], a[0][valid], atol=1e-5, rtol=0)  # log-probs
        torch.testing.assert_close(b[2], a[2], atol=1e-6, rtol=1e-5)  # loss
        scale = max(float(g.abs().max()) for g in a[3].values() if g.numel())
        for name, grad in a[3].items():
            torch.testing.assert_close(b[3][name], grad, atol=1e-4 * scale, rtol=0, msg=name)


@pytest.mark.slow
def test_compiled_ulysses_sp2_matches_eager_on_two_gloo_workers(model_paths, tmp_path):  # noqa: F811
    run_on_gloo_workers(_sp_compiled_worker, model_paths["kv4-split"], tmp_path)
