"""Tensor parallel through the real trainer: GRPO on the toy task with 2 Ray workers at tp=2 (one TP group) runs
the same steps as 2 workers at tp=1 (data parallel), and its checkpoint resumes at tp=1.

Unit-level equality (FSDPModel on gloo ranks, every path) is tests/workers/test_tensor_parallel.py; this test is the
run around it: the controller deals rows to both ranks of the TP group (which gather them at each forward),
the old-log-prob pass (2 mini-batches, so it runs), the reference (KL loss, its TP following the actor's), the
update with an entropy term, the weight sync to the colocated hf engine (every rank gets full tensors), a DCP
checkpoint saved at tp=2 that `rlkit export` turns into the run's full weights, and a resume from it at tp=1.

float32 compute, named here as well as pinned by the suite (tests/conftest.py): in bf16 the rounding alone moved the
first grad norm 2e-4 relative. Same seeds and data order: the two layouts sample the same responses every step
only if the engines got the same weights, so equal scores are the weight sync's check. Bounds: losses, KL, entropy
and grad norms 1e-5 relative or 1e-6 absolute (measured over the 3 steps: grad norms 5e-7 relative, kl_loss 3e-6,
ppo_kl 1.4e-6, pg_loss 2.5e-8 absolute: ~1e-3, a mean of terms ~1 that nearly cancel); weights after the run: the
L2 norm of the difference <= 1e-3 of the update's (measured 2.4e-5). The step resumed at tp=1 and
its weights equal the uninterrupted tp=2 run's (asserted as above) and the export equals the run's weights exactly.
The 100-step learning run at tp=2 is bench/tp_learning.py (outside the suite's time budget).
Expert parallel likewise (run by hand this stop, out of the suite for its time budget; the trainer's ep=2 path is
tests/hybrid/test_moe_hybrid.py's): a tiny Qwen3-MoE at ep=2 against the same 2 workers data parallel, with the router
load-balancing loss on (measured over the 3 steps: grad norms 1.2e-7 relative, kl_loss 2.8e-7, the load metrics
and aux loss within the bounds; weights |ep2 - dp2| 2.8e-5 of the update's 10.3).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from rlkit_cli.main import app
from tests.trainer.conftest import fit, toy_overrides, train_rows

STEPS = 3
KEYS = ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "actor/ppo_kl", "critic/score/mean")


def _overrides(toy_data, tiny_model, out, tp: int, **extra) -> list[str]:
    return toy_overrides(
        toy_data, tiny_model, out,
        trainer__n_gpus_per_node=2, trainer__total_training_steps=STEPS, trainer__save_freq=2,
        actor_rollout_ref__actor__fsdp_config__tensor_parallel_size=tp,
        actor_rollout_ref__actor__fsdp_config__param_dtype="float32",
        actor_rollout_ref__ref__fsdp_config__param_dtype="float32",
        actor_rollout_ref__actor__ppo_mini_batch_size=8,  # 2 mini-batches: the old-log-prob pass runs
        actor_rollout_ref__actor__use_kl_loss=True,  # the reference role, at the actor's tp
        actor_rollout_ref__actor__entropy_coeff=0.01,
        **extra,
    )


def _steps(rows: list[dict]) -> list[dict]:
    return [{k: r[k] for k in KEYS} | {"step": r["step"]} for r in train_rows(rows)]


def _gap(got: dict, want: dict, init: dict) -> tuple[float, float]:
    """(norm of got - want, norm of want - init) over every weight: Adam divides by sqrt(v), so float noise in a
    near-zero gradient entry moves that one weight visibly; the bound is on the whole update, not per element."""
    gap = sum(float((got[k] - want[k]).double().pow(2).sum()) for k in want) ** 0.5
    moved = sum(float((want[k] - init[k]).double().pow(2).sum()) for k in want) ** 0.5
    return gap, moved


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # export loads the shards in one process
@pytest.mark.timeout(900)  # ~1.5 min on idle cores
def test_tp2_run_matches_data_parallel_and_resumes(toy_data, tiny_model, tmp_path):
    tp2, rows2, state2 = fit("grpo", _overrides(toy_data, tiny_model, tmp_path / "tp2", 2), tmp_path / "tp2" / "logs",
                             keep_state=True)
    dp2, rows1, state1 = fit("grpo", _overrides(toy_data, tiny_model, tmp_path / "dp2", 1), tmp_path / "dp2" / "logs",
                             keep_state=True)
    a, b = _steps(rows2), _steps(rows1)
    print("tp=2:", a, "\ndp=2:", b)
    assert len(a) == len(b) == STEPS == tp2.steps == dp2.steps
    for x, y in zip(a, b):
        assert x["critic/score/mean"] == y["critic/score/mean"]  # same responses: the engines got the same weights
        for key in KEYS:
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-6), (x["step"], key)
    assert state2.keys() == state1.keys()
    init = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    gap, moved = _gap(state2, state1, init)
    print(f"weights after {STEPS} steps: |tp2 - dp2| {gap:.2e} of the update |dp2 - init| {moved:.2e}")
    assert gap <= 1e-3 * moved
    assert all(v.dtype == torch.float32 and not hasattr(v, "device_mesh") for v in state2.values())  # full tensors

    # `rlkit export` of the tp=2 checkpoint (DTensors on the (shard, tp) mesh, read in one process): the full weights
    exported = tmp_path / "exported"
    res = CliRunner().invoke(app, ["export", str(tmp_path / "tp2" / "ckpt" / f"global_step_{STEPS}"), str(exported)])
    assert res.exit_code == 0, res.output
    weights = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    assert all(torch.equal(weights[k], state2[k]) for k in state2)

    # resume the tp=2 run's step-2 checkpoint (model, optimizer, data position) at tp=1 (DCP re-cuts the shards):
    # step 3 again, the same as the uninterrupted tp=2 run's
    step2 = tmp_path / "tp2" / "ckpt" / "global_step_2"
    _, rows3, state3 = fit("grpo", _overrides(toy_data, tiny_model, tmp_path / "tp1", 1, trainer__resume_mode=step2),
                           tmp_path / "tp1" / "logs3", keep_state=True)
    c = _steps(rows3)
    assert [r["step"] for r in c] == [3]
    for key in KEYS:
        assert c[0][key] == pytest.approx(a[-1][key], rel=1e-5, abs=1e-6), key
    gap, moved = _gap(state3, state2, init)
    print(f"resumed: |resumed - tp2| {gap:.2e} of |tp2 - init| {moved:.2e}")
    assert gap <= 1e-3 * moved
