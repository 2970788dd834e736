"""The optimal token baselines and bypass_mode through the real loop (RLTrainer on Ray, the tiny model, the toy task).

One set of Ray workers serves three short runs (2 steps of 8 prompts x 4, two mini-batches per step, the engine's
log-probs on): `optimal_token_baseline`, `tir_optimal_token_baseline` and GRPO with `algorithm.bypass_mode=true`.
The runs differ only in driver-side `algorithm.*` keys, so the workers built for the first serve all three (the
actor was built with `sum_pi_squared=True`, which the bypass run never asks for). Step 2 of each is recorded
(`trainer.debug.record_steps`): the batch the updates received.

- OTB: the old-log-prob forward returned `sum_pi_squared`, a probability's square sum (p_label^2 <= it <= 1), and
  the advantages are the estimator's on the batch's own rewards, log-probs and sum_pi_squared (the advantage stage
  passed them). That the forward runs for OTB even in a one-pass run is checked without Ray below.
- bypass_mode: no `timing_s/old_log_prob` phase in any step (with two mini-batches it would run otherwise), and the
  old log-probs the update used are the engine's, bit for bit.
Learning is the bench's job (bench/objectives.py), not this test's.
"""

from __future__ import annotations

import pytest
import torch

from rlkit.algo import ADV_ESTIMATORS, AdvantageInputs
from rlkit.protocol import Batch
from tests.trainer.conftest import ensure_ray, read_metrics, toy_overrides, train_rows

STEPS = 2
OTB = ("optimal_token_baseline", "tir_optimal_token_baseline")


@pytest.fixture(scope="module")
def runs(toy_data, tiny_model, tmp_path_factory):
    """name -> (summary, train rows, the recorded batch of step 2)."""
    from rlkit.models.resolve import resolve_model_path
    from rlkit.trainer.replay.step_record import load_record, record_path
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.run.workers_setup import rl_workers
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    ensure_ray()
    root = tmp_path_factory.mktemp("otb_bypass")

    def config(name: str, **algorithm):
        extra = {f"algorithm__{k}": v for k, v in algorithm.items()}
        return load_config("grpo", toy_overrides(
            toy_data, tiny_model, root / name, trainer__total_training_steps=STEPS, trainer__save_freq=-1,
            trainer__debug__record_steps=f"[{STEPS}]", data__train_batch_size=8, actor_rollout_ref__rollout__n=4,
            actor_rollout_ref__actor__ppo_mini_batch_size=4, actor_rollout_ref__rollout__calculate_log_probs=True,
            **extra))

    cfgs = {name: config(name, adv_estimator=name) for name in OTB}
    cfgs["bypass_mode"] = config("bypass_mode", bypass_mode=True)
    workers = rl_workers(cfgs[OTB[0]], str(resolve_model_path(str(tiny_model))), STEPS * len(cfgs))
    out = {}
    try:
        for name, cfg in cfgs.items():
            with Tracking(["file"], log_dir=cfg.trainer.log_dir) as tracker:
                summary = RLTrainer(cfg, workers=workers, tracker=tracker).fit()
            record = load_record(record_path(cfg.trainer.default_local_dir, STEPS))
            out[name] = summary, train_rows(read_metrics(cfg.trainer.log_dir)), record.batch
    finally:
        workers.shutdown()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", OTB)
def test_optimal_token_baseline_runs_on_the_actors_sum_pi_squared(runs, name):
    summary, rows, batch = runs[name]
    assert summary.steps == STEPS == len(rows)
    assert all("timing_s/old_log_prob" in r and "timing_s/adv" in r for r in rows)
    mask = batch["response_mask"].bool()
    spq, old = batch["sum_pi_squared"], batch["old_log_probs"]
    assert spq.dtype == torch.float32 and spq.shape == mask.shape
    assert bool((spq[mask] <= 1 + 1e-6).all()) and bool((spq[mask] >= old[mask].exp().square() - 1e-6).all())
    assert float(spq[mask].min()) < 0.999  # a real distribution, not a placeholder of ones
    want, _ = ADV_ESTIMATORS.get(name)(AdvantageInputs(
        batch["token_level_rewards"], batch["response_mask"].float(), index=batch["uid"], old_log_probs=old,
        sum_pi_squared=spq))
    torch.testing.assert_close(batch["advantages"], want.float(), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_bypass_mode_trains_on_the_engines_log_probs(runs):
    summary, rows, batch = runs["bypass_mode"]
    assert summary.steps == STEPS == len(rows)
    assert not any("timing_s/old_log_prob" in r for r in rows)  # two mini-batches: it would run without bypass
    assert all("timing_s/update_actor" in r for r in rows)
    assert "sum_pi_squared" not in batch
    assert torch.equal(batch["old_log_probs"], batch["rollout_log_probs"])


def test_advantage_stage_passes_the_rollout_correction_weights():
    """With algorithm.rollout_is on, the OTB energy is weighted by the correction's weights (as the actor's loss
    computes them from old and rollout log-probs); without it, by nothing."""
    from rlkit.algo.rollout_correction import RolloutCorrection
    from rlkit.config.schema import RLConfig
    from rlkit.trainer.step.advantage_stage import compute_advantages

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    old = -torch.rand(4, 4, generator=g) * 2
    tensors = {"token_level_rewards": torch.tensor([[0, 0, 1.0, 0], [0, 0.5, 0, 0], [0, 0, 0, 1.0], [0, 0, 0, 0]]),
               "response_mask": mask, "old_log_probs": old,
               "rollout_log_probs": old + 0.3 * torch.randn(4, 4, generator=g),
               "sum_pi_squared": torch.rand(4, 4, generator=g) * 0.5 + 0.3}
    cfg = RLConfig()
    cfg.algorithm.adv_estimator = "optimal_token_baseline"
    results = {}
    for rollout_is in (None, "token"):
        cfg.algorithm.rollout_is = rollout_is
        batch = Batch(dict(tensors))
        batch["uid"] = ["a", "a", "a", "b"]
        compute_advantages(batch, cfg)
        results[rollout_is] = batch["advantages"]
    weights = RolloutCorrection.from_config(cfg.algorithm)(old, tensors["rollout_log_probs"], mask).weights
    common = dict(index=["a", "a", "a", "b"], old_log_probs=old, sum_pi_squared=tensors["sum_pi_squared"])
    est = ADV_ESTIMATORS.get("optimal_token_baseline")
    plain, _ = est(AdvantageInputs(tensors["token_level_rewards"], mask.float(), **common))
    weighted, _ = est(AdvantageInputs(tensors["token_level_rewards"], mask.float(), **common,
                                      rollout_is_weights=weights))
    torch.testing.assert_close(results[None], plain.float())
    torch.testing.assert_close(results["token"], weighted.float())
    assert not torch.allclose(plain, weighted)


def test_the_old_log_prob_forward_runs_for_sum_pi_squared_even_in_one_pass(toy_data, tiny_model, tmp_path):
    """One on-policy pass skips the old-log-prob forward (the update's first forward stands for it), unless the
    estimator reads sum_pi_squared, which only that forward computes."""
    import types

    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer

    workers = types.SimpleNamespace(rollout=None, reward_model=None, world_size=1, memory_peaks=lambda skip: {})
    for estimator, needed in (("grpo", False), *((name, True) for name in OTB)):
        cfg = load_config("grpo", toy_overrides(toy_data, tiny_model, tmp_path, algorithm__adv_estimator=estimator))
        assert RLTrainer(cfg, workers=workers)._needs_old_log_probs() is needed, estimator
