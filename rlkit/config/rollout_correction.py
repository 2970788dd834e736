"""The rollout-correction keys of `algorithm` (what they do: rlkit.algo.rollout_correction, docs/algorithms.md).

    rollout_is                  null | token | sequence | geometric   (true = token, false = null: a boolean also works)
    rollout_is_threshold        upper truncation of the importance weight
    rollout_rs                  null | token | sequence | geometric   rejection level, or verl's modes as a comma
                                list (token_k1, seq_max_k2, ...: rlkit/algo/rejection_modes.py)
    rollout_rs_threshold        upper rejection bound (null = rollout_is_threshold); with verl's modes one bound
                                per mode ('lower_upper' for *_k1), comma separated
    rollout_rs_threshold_lower  lower rejection bound (null = 1 / upper)
    bypass_mode                 true: the engine's log-probs are the old log-probs (no recompute forward); the
                                correction then weighs the current policy against the engine, as verl's
    bypass_loss                 ppo_clip | reinforce (verl's loss_type): with reinforce the actor's loss is -w A log pi

`settle_rollout_correction` spells them one way (a level name or None; both bounds filled in when rejection is on),
so `--dry-run` prints what runs; `check_rollout_correction` says what is wrong with them. Level names are checked
against their registry with the other registry-valued keys (rlkit.trainer.run.registered_names).
"""

from __future__ import annotations

from typing import Any

from rlkit.config.rejection_modes import is_verl_modes, parse_rules
from rlkit.config.schema import AlgorithmConfig, RLConfig
from rlkit.errors import UserError


def level(key: str, value: Any, allow_true: bool) -> str | None:
    """A level name or None; `allow_true` reads true as "token" (rollout_is: true/false is an on/off switch)."""
    if value is None or value is False:
        return None
    if value is True and allow_true:
        return "token"
    if isinstance(value, str) and value:
        return value
    spelled = "true/false, null" if allow_true else "null"
    raise UserError(f"algorithm.{key}={value!r}: name a level (token, sequence or geometric) or {spelled}")


def rs_bounds(algo: AlgorithmConfig) -> tuple[float, float]:
    """(lower, upper) rejection bounds: upper defaults to rollout_is_threshold, lower to 1 / upper."""
    key = "rollout_rs_threshold" if algo.rollout_rs_threshold is not None else "rollout_is_threshold"
    upper = float(getattr(algo, key))
    if upper <= 0:
        raise UserError(f"algorithm.{key}={upper} must be > 0 (the upper rejection bound, e.g. 2.0)")
    lower = algo.rollout_rs_threshold_lower if algo.rollout_rs_threshold_lower is not None else 1.0 / upper
    return float(lower), float(upper)


BYPASS_LOSSES = {"ppo_clip": None, "reinforce": "gpg"}  # bypass_loss -> the policy loss it runs (None: as set)


def settle_rollout_correction(cfg: RLConfig) -> None:
    """Normalise the levels; fill in the rejection bounds when rejection is on at an rlkit level (a derived value;
    verl's modes keep their bound list); bypass_loss=reinforce runs the plain policy-gradient loss."""
    algo = cfg.algorithm
    algo.rollout_is = level("rollout_is", algo.rollout_is, allow_true=True)
    if is_verl_modes(algo.rollout_rs):  # verl's comma list: a list of mode names, each checked as registered
        algo.rollout_rs = [m.strip() for m in algo.rollout_rs.split(",") if m.strip()]
    elif not isinstance(algo.rollout_rs, list):
        algo.rollout_rs = level("rollout_rs", algo.rollout_rs, allow_true=False)
        if algo.rollout_rs is not None:
            algo.rollout_rs_threshold_lower, algo.rollout_rs_threshold = rs_bounds(algo)
    if algo.bypass_loss not in BYPASS_LOSSES:
        raise UserError(f"algorithm.bypass_loss={algo.bypass_loss!r}: choose {' or '.join(BYPASS_LOSSES)}")
    loss = BYPASS_LOSSES[algo.bypass_loss]
    actor = cfg.actor_rollout_ref.actor
    if algo.bypass_mode and loss is not None and actor.policy_loss != loss:
        if actor.policy_loss != "vanilla":
            raise UserError(f"algorithm.bypass_loss={algo.bypass_loss} is the loss -w A log pi, but "
                            f"actor_rollout_ref.actor.policy_loss={actor.policy_loss}: leave policy_loss unset or set "
                            "bypass_loss=ppo_clip")
        actor.policy_loss = loss


def check_bypass_mode(cfg: RLConfig) -> None:
    """bypass_mode reads the engine's log-probs as the old ones."""
    if cfg.algorithm.bypass_mode and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        raise UserError("algorithm.bypass_mode=true uses the rollout engine's log-probs as the old ones: set "
                        "actor_rollout_ref.rollout.calculate_log_probs=true")


def check_rollout_correction(cfg: RLConfig) -> None:
    """Correction on needs the engine's log-probs; a positive IS threshold; ordered rejection bounds around 1."""
    check_bypass_mode(cfg)
    algo = cfg.algorithm
    if not (algo.rollout_is or algo.rollout_rs):
        return
    on = ", ".join(f"algorithm.{k}={getattr(algo, k)}" for k in ("rollout_is", "rollout_rs") if getattr(algo, k))
    if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        raise UserError(
            f"{on} compares the trainer's log-probs with the rollout engine's: set "
            "actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if algo.rollout_is and algo.rollout_is_threshold <= 0:
        raise UserError(
            f"algorithm.rollout_is_threshold={algo.rollout_is_threshold} must be > 0 (the largest "
            "importance weight, e.g. 2.0)"
        )
    if not algo.rollout_rs:
        return
    if isinstance(algo.rollout_rs, list):  # verl's modes (settled into a list)
        parse_rules(algo.rollout_rs, algo.rollout_rs_threshold)  # each mode's bound, or the one line saying which
        return
    lower, upper = rs_bounds(algo)
    if not 0 < lower < upper:
        raise UserError(
            f"algorithm.rollout_rs_threshold_lower={lower} and rollout_rs_threshold={upper} must satisfy "
            "0 < lower < upper"
        )
    if not lower <= 1.0 <= upper:
        raise UserError(
            f"algorithm.rollout_rs bounds [{lower}, {upper}] must contain 1 (a sample the engine and the "
            "trainer agree on has ratio 1 and must be kept)"
        )
