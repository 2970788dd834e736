"""The rollout-correction keys of `algorithm` (what they do: rlkit.algo.rollout_correction, docs/algorithms.md).

    rollout_is                  null | token | sequence | geometric   (true = token, false = null: a boolean also works)
    rollout_is_threshold        upper truncation of the importance weight
    rollout_rs                  null | token | sequence | geometric   rejection level
    rollout_rs_threshold        upper rejection bound (null = rollout_is_threshold)
    rollout_rs_threshold_lower  lower rejection bound (null = 1 / upper)
    bypass_mode                 true: the engine's log-probs are the old log-probs (no recompute forward)

`settle_rollout_correction` spells them one way (a level name or None; both bounds filled in when rejection is on),
so `--dry-run` prints what runs; `check_rollout_correction` says what is wrong with them. Level names are checked
against their registry with the other registry-valued keys (rlkit.trainer.registered_names).
"""

from __future__ import annotations

from typing import Any

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
    upper = getattr(algo, key)
    if upper <= 0:
        raise UserError(f"algorithm.{key}={upper} must be > 0 (the upper rejection bound, e.g. 2.0)")
    lower = algo.rollout_rs_threshold_lower if algo.rollout_rs_threshold_lower is not None else 1.0 / upper
    return float(lower), float(upper)


def settle_rollout_correction(cfg: RLConfig) -> None:
    """Normalise the levels; fill in the rejection bounds when rejection is on (a derived value)."""
    algo = cfg.algorithm
    algo.rollout_is = level("rollout_is", algo.rollout_is, allow_true=True)
    algo.rollout_rs = level("rollout_rs", algo.rollout_rs, allow_true=False)
    if algo.rollout_rs is not None:
        algo.rollout_rs_threshold_lower, algo.rollout_rs_threshold = rs_bounds(algo)


def check_bypass_mode(cfg: RLConfig) -> None:
    """bypass_mode reads the engine's log-probs, and leaves no trainer/engine gap for a correction to weigh."""
    algo = cfg.algorithm
    if not algo.bypass_mode:
        return
    if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        raise UserError("algorithm.bypass_mode=true uses the rollout engine's log-probs as the old ones: set "
                        "actor_rollout_ref.rollout.calculate_log_probs=true")
    if algo.rollout_is or algo.rollout_rs:
        raise UserError("algorithm.bypass_mode=true already makes the PPO ratio pi / pi_rollout (the clip is the "
                        "correction): set algorithm.rollout_is=null and algorithm.rollout_rs=null")


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
