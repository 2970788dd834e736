"""The rollout-correction keys of `algorithm` (rlkit.config.rollout_correction): spelled one way after finalize,
wrong settings refused with the key and the fix, and the actor's correction built from them."""

from __future__ import annotations

import math

import pytest

from rlkit.algo.rollout_correction import RolloutCorrection
from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config

HF = ["actor_rollout_ref.rollout.name=hf"]
LP = ["actor_rollout_ref.rollout.calculate_log_probs=true"]


def algo(*overrides: str):
    return load_config("grpo", HF + list(overrides)).algorithm


def test_the_old_switch_still_means_token_level_truncated_is():
    a = algo(*LP, "algorithm.rollout_is=true", "algorithm.rollout_is_threshold=3.0")
    assert a.rollout_is == "token" and a.rollout_rs is None
    assert RolloutCorrection.from_config(a) == RolloutCorrection(is_level="token", is_threshold=3.0)
    off = algo("algorithm.rollout_is=false")
    assert off.rollout_is is None and RolloutCorrection.from_config(off) is None


def test_rejection_bounds_are_filled_in():
    a = algo(*LP, "algorithm.rollout_rs=geometric", "algorithm.rollout_rs_threshold=1.001")
    assert a.rollout_rs_threshold == 1.001 and a.rollout_rs_threshold_lower == pytest.approx(1 / 1.001)
    default = algo(*LP, "algorithm.rollout_is=sequence", "algorithm.rollout_rs=sequence")  # upper = IS threshold
    assert (default.rollout_rs_threshold_lower, default.rollout_rs_threshold) == (0.5, 2.0)
    assert RolloutCorrection.from_config(default) == RolloutCorrection(
        is_level="sequence", is_threshold=2.0, rs_level="sequence", rs_lower=0.5, rs_upper=2.0
    )


def test_one_step_off_policy_keeps_a_chosen_level():
    a = algo("trainer.one_step_off_policy=true", "algorithm.rollout_is=sequence")
    assert a.rollout_is == "sequence"
    assert algo("trainer.one_step_off_policy=true").rollout_is == "token"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.rollout_is=sequence"],
            "algorithm.rollout_is=sequence compares .* set actor_rollout_ref.rollout.calculate_log_probs=true",
        ),
        (["algorithm.rollout_rs=token"], "algorithm.rollout_rs=token compares"),
        (
            LP + ["algorithm.rollout_rs=seq"],
            r"algorithm.rollout_rs='seq' is not registered; choose one of "
            r"\['geometric', 'seq_max_k2', .*'sequence', 'token', 'token_k1'",
        ),
        (LP + ["algorithm.rollout_rs=true"], "algorithm.rollout_rs=True: name a level"),  # not a switch
        (LP + ["algorithm.rollout_is=3"], "algorithm.rollout_is=3: name a level .* or true/false, null"),
        (
            LP
            + [
                "algorithm.rollout_rs=token",
                "algorithm.rollout_rs_threshold=2",
                "algorithm.rollout_rs_threshold_lower=3",
            ],
            "0 < lower < upper",
        ),
        (
            LP
            + [
                "algorithm.rollout_rs=token",
                "algorithm.rollout_rs_threshold=2",
                "algorithm.rollout_rs_threshold_lower=1.5",
            ],
            "must contain 1",
        ),
        (
            LP + ["algorithm.rollout_rs=token", "algorithm.rollout_rs_threshold=0"],
            "rollout_rs_threshold=0.0 must be > 0",
        ),
        (
            LP + ["algorithm.rollout_is=token", "algorithm.rollout_is_threshold=-1"],
            "rollout_is_threshold=-1.0 must be > 0",
        ),
    ],
)
def test_wrong_settings_name_the_key(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config("grpo", HF + overrides)


def test_verl_bypass_mode_is_implemented_and_needs_the_engines_log_probs():
    assert algo(*LP, "algorithm.rollout_correction.bypass_mode=true").bypass_mode is True
    with pytest.raises(UserError, match="bypass_mode=true.*calculate_log_probs=true"):
        algo("algorithm.bypass_mode=true")



def test_verls_bypass_losses_and_rejection_modes_load_as_verl_runs_them():
    """verl's rollout_corr scripts: bypass with loss_type=reinforce runs -w A log pi (rlkit's gpg loss) with the IS
    weight of the current policy over the engine's; with ppo_clip the ratio is the correction and rollout_is adds
    nothing (rejection still masks); rollout_rs as a comma list of verl's modes with one bound each."""
    a = load_config("grpo", HF + LP + [
        "algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_is_batch_normalize=true"])
    assert a.actor_rollout_ref.actor.policy_loss == "gpg" and a.algorithm.bypass_loss == "reinforce"
    rc = RolloutCorrection.from_config(a.algorithm)
    assert rc.bypass and rc.apply_is and rc.batch_normalize and rc.is_level == "sequence"
    clip = algo(*LP, "algorithm.bypass_mode=true", "algorithm.rollout_is=token",
                "algorithm.rollout_rs='token_k1,seq_max_k2'", "algorithm.rollout_rs_threshold='0.6_1.6,2.5'")
    assert clip.rollout_rs == ["token_k1", "seq_max_k2"]
    rc = RolloutCorrection.from_config(clip)
    assert rc.bypass and not rc.apply_is and rc.rs_level is None
    assert [(r.mode, r.lower, r.upper) for r in rc.rs_rules] == [
        ("token_k1", pytest.approx(math.log(0.6)), pytest.approx(math.log(1.6))), ("seq_max_k2", None, 2.5)]
    with pytest.raises(UserError, match=r"policy_loss=gspo.*bypass_loss=ppo_clip"):
        algo(*LP, "algorithm.bypass_mode=true", "algorithm.bypass_loss=reinforce",
             "actor_rollout_ref.actor.policy_loss=gspo")
    with pytest.raises(UserError, match=r"rollout_rs_threshold '2.0_3.0' for seq_mean_k3: a k3 mode takes one upper"):
        algo(*LP, "algorithm.rollout_rs=seq_mean_k3", "algorithm.rollout_rs_threshold=2.0_3.0")
    with pytest.raises(UserError, match=r"3 bounds for 2 modes"):
        algo(*LP, "algorithm.rollout_rs=[token_k2,seq_sum_k3]", "algorithm.rollout_rs_threshold='1,2,3'")
    with pytest.raises(UserError, match=r"algorithm.rollout_rs='seq_max_k1' is not registered"):
        algo(*LP, "algorithm.rollout_rs=seq_max_k1", "algorithm.rollout_rs_threshold=2")
