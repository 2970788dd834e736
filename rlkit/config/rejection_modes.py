"""verl's rejection modes as config: `algorithm.rollout_rs` as a comma list of `<aggregate>_<divergence>` names
and `rollout_rs_threshold` as their bounds, read into `RejectRule`s (the math: rlkit/algo/rejection_modes.py).

With lr = log(pi_old / pi_rollout) per valid token:

    divergence   k1 = -lr            (bounds "lower_upper" read as ratios: log(lower) <= stat <= log(upper);
                                      one number u means 1/u_u)
                 k2 = lr^2 / 2       (an upper bound only)
                 k3 = e^lr - 1 - lr  (an upper bound only)
    aggregate    token (each token alone), seq_sum, seq_mean, seq_max (over the row's valid tokens; a row-level
                 statistic rejects or keeps the whole row; seq_max exists for k2/k3)

A token is kept only if every listed mode keeps it. `rollout_rs_threshold` gives one bound per mode, comma
separated, or one shared by all. These are verl's names and semantics (verl/trainer/ppo/rollout_corr_helper.py);
rlkit's own level names (token | sequence | geometric) are the k1 modes with bounds on pi_old / pi_rollout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlkit.errors import UserError

AGGREGATES = ("token", "seq_sum", "seq_mean", "seq_max")
DIVERGENCES = ("k1", "k2", "k3")
MODES = tuple(f"{agg}_{div}" for agg in AGGREGATES for div in DIVERGENCES if (agg, div) != ("seq_max", "k1"))


@dataclass(frozen=True)
class RejectRule:
    """One mode and its bounds on the statistic (`lower` only for k1; k1 bounds in log space)."""

    mode: str
    upper: float
    lower: float | None = None

    @property
    def aggregate(self) -> str:
        return self.mode.rsplit("_", 1)[0]

    @property
    def divergence(self) -> str:
        return self.mode.rsplit("_", 1)[1]


def is_verl_modes(value: str | None) -> bool:
    """Whether `rollout_rs` names verl's modes (one or a comma list) rather than an rlkit level."""
    parts = [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else []
    return bool(parts) and all(part in MODES for part in parts)


def parse_rules(modes: str | list[str], threshold: float | str | None,
                key: str = "algorithm.rollout_rs") -> tuple[RejectRule, ...]:
    """The rules of a `rollout_rs` comma list (or list) and its `rollout_rs_threshold` (one per mode, or one for
    all)."""
    parts = modes.split(",") if isinstance(modes, str) else modes
    names = list(dict.fromkeys(p.strip() for p in parts if p.strip()))
    modes = ",".join(names)
    if threshold is None:
        raise UserError(f"{key}={modes} needs {key}_threshold: one bound per mode (comma separated; "
                        "'lower_upper' ratios for *_k1 modes), e.g. 0.5_2.0 or 0.01")
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()]
    if len(specs) == 1:
        specs *= len(names)
    if len(specs) != len(names):
        raise UserError(f"{key}_threshold={threshold}: {len(specs)} bounds for {len(names)} modes ({modes}); give "
                        "one per mode or one for all")
    return tuple(_rule(name, spec, key) for name, spec in zip(names, specs, strict=True))


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{where}: not a number") from None


def _rule(mode: str, spec: str, key: str) -> RejectRule:
    where = f"{key}_threshold '{spec}' for {mode}"
    if mode.endswith("k1"):
        lower, _, upper = spec.partition("_") if "_" in spec else ("", "", spec)
        hi = _number(upper, where)
        lo = _number(lower, where) if lower else 1 / hi if hi > 0 else 0.0
        if not 0 < lo < hi:
            raise UserError(f"{where}: needs 0 < lower < upper (ratios, 'lower_upper')")
        return RejectRule(mode, math.log(hi), math.log(lo))
    if "_" in spec:
        raise UserError(f"{where}: a {mode[-2:]} mode takes one upper bound, not 'lower_upper'")
    upper = _number(spec, where)
    if upper <= 0:
        raise UserError(f"{where}: must be > 0")
    return RejectRule(mode, upper)
