"""GRPO on the toy task with a tiny Qwen3-MoE, hf rollout, with and without routing replay
(actor.router_replay): all three run (off, the engine's routes, the old-log-prob pass's routes as verl's R2),
the replayed run trains on the engine's routes, and the engine-vs-trainer
log-prob gap (`rollout/log_prob_abs_diff`) of each is reported (docs/moe.md has the measured numbers)."""

from __future__ import annotations

import pytest

from rlkit.testing import save_tiny_moe
from tests.trainer.conftest import fit, toy_overrides, train_rows

STEPS = 4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_with_router_replay_runs_and_reports_the_gap(toy_data, tmp_path):
    model = save_tiny_moe(tmp_path / "moe", family="qwen3_moe", sharpen=1.0, hidden=64, heads=1, experts=4, tie=True)
    gaps = {}
    for replay in ("false", "true", "old_log_prob"):  # off; the engine's routes (R3); the old-log-prob pass's (R2)
        out = tmp_path / f"replay_{replay}"
        overrides = toy_overrides(
            toy_data,
            model,
            out,
            trainer__total_training_steps=STEPS,
            actor_rollout_ref__rollout__calculate_log_probs="true",
            actor_rollout_ref__actor__recompute_old_log_prob="true",
            actor_rollout_ref__actor__router_replay="false" if replay == "false" else "true",
            actor_rollout_ref__actor__router_replay_from="old_log_prob" if replay == "old_log_prob" else "rollout",
        )
        summary, rows, _ = fit("grpo", overrides, out / "logs")
        steps = train_rows(rows)
        assert summary.steps == STEPS == len(steps)
        assert all("actor/router_aux_loss" in r for r in steps)
        gaps[replay] = [r["rollout/log_prob_abs_diff"] for r in steps]
    print("engine-vs-trainer log-prob gap per step without replay:", gaps["false"], "with replay:", gaps["true"])
    assert max(gaps["true"]) < 1e-4, gaps  # float32 engine and trainer on the engine's routes: kernel noise
    # step 1 samples the same rollout in both runs, and a float32 engine routes as the trainer does: replaying
    # those routes must leave the trainer's log-probs bit-identical (measured: every step identical)
    assert gaps["true"][0] == gaps["false"][0], gaps
    assert gaps["old_log_prob"][0] == gaps["false"][0], gaps  # R2 captures in the old-log-prob pass, a plain forward
