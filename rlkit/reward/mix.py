"""The reward of a sample as a weighted sum of components: rule scorers, a reward model, a judge.

    score = w_rule * rule + w_rm * rm          (reward_model.mix: {rule: 1.0, rm: 1.0})

One place for training and validation alike (the trainer's `reward_fn`). With `reward_model.enable`
off the reward manager is the reward stage as it is; with it on, `RewardMix` runs:

- `rule`: the configured reward manager (rule scorers by data_source, or a custom function), on the
  rows that have a scorer. A data_source without a scorer has no rule part (pure-RM data); `rule: 0`
  (every data_source) runs no scorer at all.
- the style's component (rlkit.reward.model_styles): `rm` (classifier worker) or `judge`.

Weights: a component that runs and is not named in `mix` weighs 1.0; `mix.by_data_source.<ds>`
overrides them for that data_source. Each component's mean is logged as `reward/<component>/mean`
(`reward/rule/mean`, `reward/rm/mean`, `reward/judge/mean`, over the rows it scored); the sum lands on
the last valid response token as `token_level_scores`, like every reward manager's.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlkit.errors import UserError
from rlkit.protocol import METRICS_KEY, Batch
from rlkit.reward.interaction_reward import with_interaction_reward
from rlkit.reward.model_styles import RULE, Component, all_components, model_style
from rlkit.reward.placement import on_last_token
from rlkit.reward.registry import RewardFn, build_reward_manager
from rlkit.reward.scorer_key import with_scorer_key

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

BY_DATA_SOURCE = "by_data_source"
KEY = "reward_model.mix"


class MixWeights:
    """`reward_model.mix` read: weight(component, data_source); unnamed components weigh `default`."""

    def __init__(self, mix: Mapping[str, Any] | None, default: float = 1.0) -> None:
        mix = dict(mix or {})
        self.by_source = {str(k): dict(v) for k, v in dict(mix.pop(BY_DATA_SOURCE, None) or {}).items()}
        self.base = {k: float(v) for k, v in mix.items()}
        self.default = default

    def weight(self, component: str, data_source: str) -> float:
        source = self.by_source.get(data_source, {})
        if component in source:
            return float(source[component])
        return self.base.get(component, self.default)

    def weights(self, component: str, data_sources: list[str]) -> torch.Tensor:
        return torch.tensor([self.weight(component, ds) for ds in data_sources], dtype=torch.float32)

    def ever_used(self, component: str) -> bool:
        """False when the component weighs 0 for every data_source (then it is not run)."""
        return self.base.get(component, self.default) != 0 or any(
            float(s.get(component, 0)) != 0 for s in self.by_source.values()
        )

    def named(self) -> set[str]:
        return set(self.base) | {c for s in self.by_source.values() for c in s}


def check_mix(cfg: RLConfig) -> None:
    """UserError for a weight of an unknown component, a non-number, a component that does not run, or a mix
    set while no model reward runs (the rule reward is then used as it is)."""
    rm = cfg.reward_model
    mix = dict(rm.mix or {})
    if not mix:
        return
    if not rm.enable:
        raise UserError(
            f"{KEY} is set but reward_model.enable=false: the rule reward is used as it is; turn "
            "the model reward on (reward_model.enable=true) or remove the mix"
        )
    known = all_components()
    running = [RULE, model_style(cfg).component]
    by_source = mix.pop(BY_DATA_SOURCE, None) or {}
    if not isinstance(by_source, Mapping):
        raise UserError(f"{KEY}.{BY_DATA_SOURCE} must map data_source -> {{component: weight}}")
    tables = [("", mix)] + [(f"{BY_DATA_SOURCE}.{ds}.", w) for ds, w in by_source.items()]
    for prefix, table in tables:
        if not isinstance(table, Mapping):
            raise UserError(f"{KEY}.{prefix.rstrip('.')} must map component -> weight, e.g. {{rule: 1.0, rm: 0.5}}")
        for name, weight in table.items():
            if name not in known:
                raise UserError(
                    f"{KEY}.{prefix}{name}: unknown reward component; components: {', '.join(known)}"
                    + ("" if prefix else f" (and {BY_DATA_SOURCE})")
                )
            if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not np.isfinite(weight):
                raise UserError(f"{KEY}.{prefix}{name}={weight!r} must be a number")
            if name not in running:
                raise UserError(
                    f"{KEY}.{prefix}{name} is set but the {name} component does not run with "
                    f"reward_model.style={rm.style}; components that run: {', '.join(running)}"
                )
    weights = MixWeights(rm.mix)
    if not any(weights.ever_used(c) for c in running):
        raise UserError(f"{KEY}: every weight is 0, so every sample would score 0; give one component a weight")


def check_reward_model(cfg: RLConfig) -> None:
    """The model reward's checks (its style's, rlkit.reward.model_styles) and the mix weights."""
    style = model_style(cfg)
    if style is not None:
        style.check(cfg)
    check_mix(cfg)


class RewardMix:
    """The reward stage with a model reward: the rule manager (or None) + named components, mixed."""

    def __init__(self, rule: RewardFn | None, components: Mapping[str, Component], weights: MixWeights) -> None:
        self.rule = rule
        self.components = dict(components)
        self.weights = weights

    def __call__(self, batch: Batch) -> Batch:
        n = len(batch)
        data_sources = [str(d) for d in batch["data_source"]] if "data_source" in batch else [""] * n
        mask = batch["response_mask"]
        total = torch.zeros(n, dtype=torch.float32)
        metrics: dict[str, list[float]] = {}
        tensors: dict[str, torch.Tensor] = {}
        non_tensors: dict[str, list[Any]] = {}
        if self.rule is not None:
            rows = self._rule_rows(data_sources)
            if rows:
                scored = self.rule(batch if len(rows) == n else batch.index(rows))
                values = torch.zeros(n, dtype=torch.float32)
                values[rows] = scored["token_level_scores"].sum(-1).float()
                total += self.weights.weights(RULE, data_sources) * values
                metrics.update(scored.meta.get(METRICS_KEY, {}))
                metrics[f"reward/{RULE}/mean"] = [float(values[rows].mean())]
                for key, column in scored.non_tensors.items():
                    full: list[Any] = [None] * n
                    for i, value in zip(rows, column):
                        full[i] = value
                    non_tensors[key] = full
        for name, component in self.components.items():
            out = component(batch)
            total += self.weights.weights(name, data_sources) * out.values.float()
            metrics[f"reward/{name}/mean"] = [float(out.values.mean())] if n else [0.0]
            metrics.update({k: [v] for k, v in out.metrics.items() if k != f"reward/{name}/mean"})
            tensors.update(out.tensors)
        tensors["token_level_scores"] = on_last_token(total, mask)
        return Batch(tensors, non_tensors, {METRICS_KEY: metrics})

    def _rule_rows(self, data_sources: list[str]) -> list[int]:
        """Rows the rule manager scores: its weight is not 0 there and the manager has a scorer for it."""
        has = getattr(self.rule, "has_scorer", lambda ds: True)
        known = {ds: has(ds) and self.weights.weight(RULE, ds) != 0 for ds in set(data_sources)}
        return [i for i, ds in enumerate(data_sources) if known[ds]]

    def close(self) -> None:
        for component in self.components.values():
            close = getattr(component, "close", None)
            if close is not None:
                close()


def build_reward_fn(
    cfg: RLConfig, tokenizer: Any, workers: Mapping[str, Any] | None = None, manager: RewardFn | None = None
) -> RewardFn:
    """The reward stage of a run: the reward manager, mixed with the model reward when `reward_model.enable`.
    `workers`: worker role name -> the view the style's component calls (the trainer's `reward_model`);
    `manager`: the reward manager if already built (else built here)."""
    manager = manager if manager is not None else build_reward_manager(cfg, tokenizer)
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    weight = mt.interaction_reward_weight if mt.enable else 0.0
    style = model_style(cfg)
    if style is None:
        return with_scorer_key(with_interaction_reward(manager, weight), cfg.data.reward_fn_key)
    weights = MixWeights(cfg.reward_model.mix)
    worker = (workers or {}).get(style.worker_role) if style.worker_role else None
    component = style.build(cfg, tokenizer, worker)
    mix = RewardMix(manager if weights.ever_used(RULE) else None, {style.component: component}, weights)
    return with_scorer_key(with_interaction_reward(mix, weight), cfg.data.reward_fn_key)


def describe(cfg: RLConfig) -> str:
    """One line for the printed resource plan: the components and their weights."""
    style = model_style(cfg)
    if style is None:
        return f"{RULE} ({cfg.reward_model.reward_manager})"
    weights = MixWeights(cfg.reward_model.mix)
    parts = [f"{c} x{weights.base.get(c, weights.default):g}" for c in (RULE, style.component)]
    extra = f"; per data_source: {', '.join(sorted(weights.by_source))}" if weights.by_source else ""
    return f"{' + '.join(parts)} (style {cfg.reward_model.style}{extra})"
