"""`train_step` returns a typed StepResult; the MFU meter reads its phases; no timing name is overwritten.

`timing_s/<phase>` is the driver's time of a phase; a worker's own timings have other names
(`timing_s/generate_sequences` is the engine's generation inside the driver's `timing_s/gen`).
"""

from __future__ import annotations

import logging

import pytest
import torch

from rlkit.trainer.step.step_result import StepResult
from rlkit.utils import flops
from tests.trainer.conftest import toy_overrides

PPO_PHASES = {"gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
              "update_weights"}


class _Meter:
    def __call__(self, flops_: float, seconds: float) -> float:
        return flops_ / seconds / 1e12


def test_log_row_names_phases_and_derives_perf():
    result = StepResult({"actor/pg_loss": 0.5, "timing_s/generate_sequences": 1.5},
                        {"gen": 2.0, "update_actor": 1.0}, tokens=300.0, flops=4e12)
    row = result.log_row(4.0, _Meter())
    assert row == {"actor/pg_loss": 0.5, "timing_s/generate_sequences": 1.5, "timing_s/gen": 2.0,
                   "timing_s/update_actor": 1.0, "timing_s/step": 4.0, "perf/throughput": 75.0, "perf/mfu": 1.0}
    assert "perf/mfu" not in StepResult({}, tokens=1.0).log_row(1.0, _Meter())  # FLOPs not counted
    assert "perf/mfu" not in result.log_row(1.0, None)  # no meter


def test_a_worker_timing_under_a_phase_name_warns_and_the_driver_wins(caplog):
    result = StepResult({"timing_s/ref": 0.1}, {"ref": 0.3})
    with caplog.at_level(logging.WARNING, logger="rlkit.trainer"):
        row = result.log_row(1.0)
    assert row["timing_s/ref"] == 0.3
    assert "timing_s/ref" in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_step_returns_a_step_result(ray_local, toy_data, tiny_model, tmp_path):
    """One real PPO step (critic, reference, recomputed old log-probs): every phase timed once by the driver,
    the engine's own time under its own name, FLOPs counted from the phases. Before it, a step of
    trainer.critic_warmup=1 (one critic-only step: the actor first updates at step 2): the critic trains, the actor's
    weights and the engines' stay as they were."""
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer

    overrides = toy_overrides(
        toy_data, tiny_model, tmp_path, data__train_batch_size=4, actor_rollout_ref__rollout__n=2,
        actor_rollout_ref__actor__ppo_mini_batch_size=4, actor_rollout_ref__actor__use_kl_loss=True,
        actor_rollout_ref__actor__recompute_old_log_prob=True, trainer__total_training_steps=2,
        trainer__critic_warmup=1,
    )
    cfg = load_config("ppo", overrides)
    trainer = RLTrainer(cfg)
    calls = []
    meter = trainer.mfu_meter
    assert meter is not None
    count = meter.step_flops

    def recording_step_flops(mask, phases):  # the real count, with its inputs kept for the check below
        calls.append((mask.clone(), set(phases)))
        return count(mask, phases)

    def actor_weights():
        return trainer.workers.actor.full_state_dict()[0]

    try:
        initial = actor_weights()
        trainer.global_step = 1
        warmup = trainer.train_step()
        after_warmup = actor_weights()
        meter.step_flops = recording_step_flops
        trainer.global_step = 2
        result = trainer.train_step()
        after_update = actor_weights()
    finally:
        trainer.workers.shutdown()

    # the warm-up step: critic only, no actor update, no weight sync
    assert set(warmup.phases) == PPO_PHASES - {"update_actor", "update_weights"}
    assert "critic/vf_loss" in warmup.metrics and "actor/pg_loss" not in warmup.metrics
    assert "timing_s/rollout_load_weights" not in warmup.metrics
    assert all(torch.equal(initial[k], after_warmup[k]) for k in initial)
    assert any(not torch.equal(after_warmup[k], after_update[k]) for k in initial)  # step 2 updates the actor
    assert "actor/pg_loss" in result.metrics

    assert isinstance(result, StepResult)
    assert set(result.phases) == PPO_PHASES and all(s > 0 for s in result.phases.values())
    clash = {f"timing_s/{p}" for p in result.phases} & set(result.metrics)
    assert not clash, f"worker metrics named like driver phases: {clash}"
    assert not any(k.startswith("_") for k in result.metrics)  # no private keys ride along any more
    engine_s = result.metrics["timing_s/generate_sequences"]
    assert 0 < engine_s <= result.phases["gen"]  # the engine's generation is inside the driver's stage
    assert "timing_s/rollout_load_weights" in result.metrics

    (mask, phases), = calls
    assert phases == PPO_PHASES
    assert result.tokens == float(mask.sum()) == pytest.approx(len(mask) * (
        result.metrics["prompt_length/mean"] + result.metrics["response_length/mean"]))
    lengths = mask.sum(-1).tolist()
    # 3 scoring forwards (old log-probs, reference, values) + actor and critic updates (3 forwards each, 1 epoch)
    assert result.flops == pytest.approx(9 * flops.forward_flops(meter.model_config, lengths))

    row = result.log_row(2.0, meter)
    assert row["timing_s/gen"] == result.phases["gen"] and row["timing_s/generate_sequences"] == engine_s
    assert row["perf/throughput"] == pytest.approx(result.tokens / 2.0)
    assert row["perf/mfu"] == pytest.approx(result.flops / 2.0 / meter.peak)
