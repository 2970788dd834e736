"""The trainer learns: GRPO and PPO (with a critic) on the toy copy task from a random tiny model.

(bf16 compute against this fp32 run, over data seeds: bench/learning_precision.py --task toy; other layouts and
engines: bench/learning_variants.py. Both are outside the suite's time budget.)

"copy the digits : 7" -> "7"; the toy_copy scorer gives digit-position accuracy, so a random model
scores ~0.05 and a perfect one 1.0. The tiny model has tied embeddings (a built-in copy bias), which
is what makes the task learnable from scratch in ~100 steps. Seeds are fixed (data order, rollout
sampling, init); across 4 other data/sampling seeds GRPO reached a last-20 mean of 0.70-0.76 by step
80 (the threshold is 0.5 at step 100) and greedy validation 0.81-1.0.

Settings measured on 2 shared cores: 1 worker with 1 CPU is the fastest (~0.3 s/step here); two torch
threads per worker (trainer.cpus_per_worker=2) ran 10x slower when the cores were oversubscribed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.trainer.conftest import fit, learning_overrides, train_rows

STEPS = 100


def _mean(xs):
    return statistics.fmean(xs)


@pytest.fixture(scope="module")
def grpo_run(toy_data, tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo")
    overrides = learning_overrides(toy_data, tiny_model, out, STEPS)
    summary, rows, state = fit("grpo", overrides, out / "logs", keep_state=True)
    return summary, rows, state, out


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~1-2 min on idle cores; far more when the machine is shared
def test_grpo_learns_the_copy_task(grpo_run):
    summary, rows, _, _ = grpo_run
    scores = [r["critic/score/mean"] for r in train_rows(rows)]
    assert len(scores) == STEPS == summary.steps
    first, last = _mean(scores[:10]), _mean(scores[-20:])
    val_key = "val/rlkit/toy_copy/score/mean@1"
    print(f"GRPO train reward first 10 {first:.3f} -> last 20 {last:.3f}; "
          f"greedy val {summary.first_val[val_key]:.3f} -> {summary.last_val[val_key]:.3f}; "
          f"median step {statistics.median(summary.step_seconds):.2f}s")
    assert first < 0.2
    assert last > 0.5
    assert summary.first_val[val_key] < 0.2
    assert summary.last_val[val_key] > 0.6
    # the step metrics a user reads, with the field's names
    step = train_rows(rows)[-1]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr", "actor/pg_clipfrac", "critic/advantages/mean",
                "response_length/mean", "response_length/clip_ratio", "timing_s/gen", "timing_s/reward",
                "timing_s/update_actor", "timing_s/step", "perf/throughput", "timing_s/generate_sequences"):
        assert key in step, key
    assert step["timing_s/generate_sequences"] <= step["timing_s/gen"]  # the engine's time, inside the driver's
    # each worker call's own peak RSS (GB), in every step row and, max over the run, in the summary
    for phase in ("generate_sequences", "update_actor", "sync_weights"):
        key = f"memory/{phase}/rss_peak_gb"
        assert all(0.05 < r[key] < 24 for r in train_rows(rows)), key
        assert summary.memory_peaks[key] == max(r[key] for r in train_rows(rows))
    assert "memory/dispatch_info/rss_peak_gb" not in step  # bookkeeping calls are not phases
    assert summary.checkpoint is not None and summary.checkpoint.endswith(f"global_step_{STEPS}")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # export loads the shards in one process
def test_export_gives_the_trained_actor(grpo_run, tiny_model, tmp_path):
    """`rlkit export CKPT OUT` -> from_pretrained(OUT) has the trained actor's logits (and copies digits)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit_cli.main import app

    summary, _, state, _ = grpo_run
    out = tmp_path / "exported"
    res = CliRunner().invoke(app, ["export", summary.checkpoint, str(out)])
    assert res.exit_code == 0, res.output
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    initial = {k: v.clone() for k, v in actor.state_dict().items()}
    actor.load_state_dict(state)  # the weights the FSDP actor held after training (full_state_dict)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"copy the digits : {d}"}], tokenize=False,
                                       add_generation_prompt=True) for d in range(10)]
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        got = exported(**enc).logits
        want = actor(**enc).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
    moved = max(float((state[k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-2  # it is the trained model, not the initial one
    # and it does the task: greedy first token = the digit for most prompts
    with torch.no_grad():
        first = exported(**enc).logits[:, -1].argmax(-1)
    digits = tok.convert_ids_to_tokens(first.tolist())
    assert sum(d == str(i) for i, d in enumerate(digits)) >= 6, digits


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~1-2 min on idle cores; far more when the machine is shared
def test_ppo_with_a_critic_learns(toy_data, tiny_model, tmp_path):
    """The ppo preset (GAE, critic on) with n=8 samples per prompt and 2 PPO mini-batches per step.

    Measured (100 steps, 3 seeds): last-20 reward 0.58-0.66 from ~0.05; with one update per step
    (mini-batch = batch) it learns too but slower and less reliably (0.22-0.74). The critic's mean
    value stays within 0.01 of the mean reward once trained.
    """
    overrides = learning_overrides(
        toy_data, tiny_model, tmp_path, STEPS,
        actor_rollout_ref__rollout__n=8,
        actor_rollout_ref__actor__ppo_mini_batch_size=16,
        critic__optim__lr=1e-3,
        critic__ppo_micro_batch_size_per_gpu=64,
        # calibrated on padded rows; packed rows (the default) agree to 1e-5
        # (tests/workers/test_varlen_attention.py), but this PPO trajectory is seed-sensitive on both paths:
        # gain (last 20 - first 10) packed / padded, data seed 1: +0.12 / +0.37, seed 4: +0.78 / +0.91,
        # seed 5: +0.49 / +0.41 (packed seeds 2, 3: +0.56, +0.12); no systematic gap, so the test keeps the
        # path and seed it was calibrated on
        actor_rollout_ref__model__use_remove_padding=False,
        # and on torch's per-parameter AdamW: rlkit's default became the fused one (rlkit/utils/optimizer.py), which
        # differs from it by rounding (6e-8 after 20 steps) and sends this trajectory elsewhere: last 20 0.505 with
        # the loop, 0.166 fused, from the same 0.059 (measured 2026-12-06)
        actor_rollout_ref__actor__optim__override_optimizer_config="{fused:false}",
        critic__optim__override_optimizer_config="{fused:false}",
        trainer__debug__check_batch_keys=True,  # every role's output against rlkit/batch_keys.py (no numerics change)
        # verl's profiler keys (no numerics change): a torch trace of each actor / critic / rollout call of step 2
        global_profiler__tool="torch", global_profiler__steps="[2]", global_profiler__save_path=str(tmp_path / "prof"),
        actor_rollout_ref__actor__profiler__enable=True, critic__profiler__enable=True,
        actor_rollout_ref__rollout__profiler__enable=True,
        actor_rollout_ref__actor__profiler__tool_config__torch__contents="[cpu,shapes]",
    )
    summary, rows, _ = fit("ppo", overrides, tmp_path / "logs")
    _check_traces(tmp_path / "prof")
    steps = train_rows(rows)
    scores = [r["critic/score/mean"] for r in steps]
    values = [r["critic/values/mean"] for r in steps]
    first, last = _mean(scores[:10]), _mean(scores[-20:])
    print(f"PPO train reward first 10 {first:.3f} -> last 20 {last:.3f}; critic value mean last 20 "
          f"{_mean(values[-20:]):.3f}; median step {statistics.median(summary.step_seconds):.2f}s")
    assert "critic/vf_loss" in steps[-1] and "timing_s/update_critic" in steps[-1]
    assert last > first + 0.25
    assert abs(_mean(values[-20:]) - last) < 0.1  # the critic learned the value of the current policy


def _check_traces(root: Path) -> None:
    """global_profiler: one Chrome trace per worker call of the listed step, per enabled role, rank 0, that parses
    and holds the call's torch ops (shapes recorded where asked)."""
    assert sorted(p.name for p in root.iterdir()) == ["step_2"]
    traces = {p.name.removesuffix(".pt.trace.json"): p for p in (root / "step_2").iterdir()}
    for name in ("actor_rank0_update_actor", "critic_rank0_update_critic",
                 "critic_rank0_compute_values", "rollout_rank0_generate_sequences"):
        assert name in traces, sorted(traces)
    events = json.loads(traces["actor_rank0_update_actor"].read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert any(e["name"] == "aten::mm" or e["name"] == "aten::addmm" for e in ops)
    assert any("Input Dims" in e.get("args", {}) for e in ops)  # contents=[cpu,shapes]
