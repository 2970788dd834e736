"""TRL's `GRPOConfig.loss_type`, read as `actor_rollout_ref.actor.loss_type`: each name sets the rlkit keys of
the same objective, and one notice line says which (a rule of rlkit.config.verl_keys).

The keys it sets replace what the config composed for them, so set either `loss_type` or those keys.
"""

from __future__ import annotations

from typing import Any

from rlkit.errors import UserError

ACTOR = "actor_rollout_ref.actor"

#: TRL loss_type -> ({rlkit key under actor: value}, what the objective is)
TRL_LOSS_TYPES: dict[str, tuple[dict[str, Any], str]] = {
    "grpo": ({"policy_loss": "vanilla", "loss_agg_mode": "seq-mean-token-mean"},
             "PPO clip, mean over each response's tokens, then over responses"),
    "dr_grpo": ({"policy_loss": "vanilla", "loss_agg_mode": "seq-mean-token-sum-norm"},
                "PPO clip, token sums over a constant (responses x response length)"),
    "dapo": ({"policy_loss": "vanilla", "loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
             "PPO clip-higher (0.2 / 0.28), mean over every token of the mini-batch"),
    "bnpo": ({"policy_loss": "vanilla", "loss_agg_mode": "token-mean"},
             "PPO clip, mean over every token (rlkit normalises by the global mini-batch's tokens, TRL by the "
             "local batch's)"),
    "cispo": ({"policy_loss": "cispo", "loss_agg_mode": "token-mean", "clip_ratio_low": 1.0},
              "truncated, detached importance weight times A log pi; no lower bound, upper = clip_ratio_high"),
    "sapo": ({"policy_loss": "sapo", "loss_agg_mode": "seq-mean-token-mean"},
             "soft gate with temperatures tau_pos / tau_neg"),
    "luspo": ({"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-sum"},
              "GSPO's sequence ratio with each response's loss scaled by its length (token sum)"),
    "vespo": ({"policy_loss": "vespo", "loss_agg_mode": "token-mean"},
              "detached gamma kernel of the whole-sequence ratio times A log pi (vespo_k_* / vespo_lambda_*)"),
}

#: TRL names with no rlkit objective: why, and what to use (none today; a name TRL adds goes here until it lands)
MISSING: dict[str, str] = {}


def trl_loss_type(value: Any, key: str) -> tuple[dict[str, Any], str]:
    """A `mapped` rule's derive: TRL's loss_type -> the rlkit keys it stands for, and the notice."""
    name = str(value).lower()
    if name in MISSING:
        raise UserError(f"config key '{key}={value}' is not supported by rlkit: {MISSING[name]}")
    if name not in TRL_LOSS_TYPES:
        known = ", ".join([*TRL_LOSS_TYPES, *MISSING])
        raise UserError(f"config key '{key}={value}': not one of TRL's loss types ({known})")
    values, what = TRL_LOSS_TYPES[name]
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    return {f"{ACTOR}.{k}": v for k, v in values.items()}, f"{shown} (under {ACTOR}): {what}"
