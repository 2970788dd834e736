"""What an algorithm entry needs, declared next to its registration, read by everyone who provides it.

Advantage estimators, policy losses and loss-aggregation modes say what they read with one
decorator under their `@REGISTRY.register(...)`:

    @ADV_ESTIMATORS.register("gae")
    @needs(values=True)
    def gae(...): ...

The config checks (a critic is on, n >= 2), the worker layout (build a critic / a reference),
the step (generate a greedy baseline) and the micro-batch loss scales (the aggregation unit)
read these declarations through `needs_of` / `run_needs`; none of them knows an entry's name,
so a newly registered entry needs no edit anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import reduce
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from rlkit.errors import UserError
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

T = TypeVar("T")
Unit = Callable[[torch.Tensor], torch.Tensor]  # (B, R) mask -> how many things a loss averages over


@dataclass(frozen=True)
class Needs:
    """Inputs an entry reads beyond the batch every step has (rewards, log-probs, the response mask)."""

    values: bool = False  # critic `values` (B, R): a value model is built and trained
    groups: bool = False  # several samples per prompt (`index`/uid): actor_rollout_ref.rollout.n >= 2
    ref: bool = False  # `ref_log_prob` (B, R) of the frozen reference policy: the reference model is built
    greedy_baseline: bool = False  # `reward_baselines` (B,): the reward of one greedy response per prompt
    unit: Unit | None = None  # loss aggregation: what the mode averages over (micro-batch losses are reweighted by it)

    def __or__(self, other: Needs) -> Needs:
        """Union of two sets of needs (flags OR-ed; the unit of the left side wins)."""
        flags = {f.name: getattr(self, f.name) or getattr(other, f.name) for f in fields(self) if f.name != "unit"}
        return Needs(**flags, unit=self.unit or other.unit)


#: human words for each flag, used in error messages
NEED_WORDS = {
    "values": "a critic (values)",
    "groups": "several samples per prompt",
    "ref": "the reference model (ref_log_prob)",
    "greedy_baseline": "a greedy baseline response per prompt",
}


def needs(**kwargs: Any) -> Callable[[T], T]:
    """Decorator: `@needs(values=True)` declares what an entry reads (see `Needs`); put it under `register`."""
    declared = Needs(**kwargs)

    def deco(obj: T) -> T:
        obj.needs = declared  # type: ignore[attr-defined]
        return obj

    return deco


def needs_of(registry: Registry[Any], name: str) -> Needs:
    """The `Needs` of a registered entry (nothing declared: `Needs()`); UserError with close matches if unknown."""
    return getattr(registry.get(name), "needs", Needs())


# ------------------------------------------------------------------------------------------- units
def tokens(mask: torch.Tensor) -> torch.Tensor:
    """Valid tokens (token-mean)."""
    return mask.sum()


def sequences(mask: torch.Tensor) -> torch.Tensor:
    """Rows with at least one valid token (the seq-mean modes skip empty rows)."""
    return (mask.sum(-1) > 0).sum()


def rows(mask: torch.Tensor) -> torch.Tensor:
    """Every row, empty or not (a constant normaliser)."""
    return torch.tensor(mask.shape[0])


def agg_unit(mode: str) -> Unit:
    """The unit a registered loss-aggregation mode averages over; UserError if it declares none."""
    from rlkit.algo.utils import LOSS_AGG

    unit = needs_of(LOSS_AGG, mode).unit
    if unit is None:
        raise UserError(
            f"loss aggregation mode '{mode}' declares no unit: register it with @needs(unit=tokens | sequences | "
            "rows) from rlkit.algo.needs, so micro-batch losses add up to the mini-batch loss"
        )
    return unit


# ------------------------------------------------------------------------------------------- a run
def algorithm_registries() -> dict[str, Registry[Any]]:
    """Config key -> the registry its value names, for every algorithm entry a run uses."""
    from rlkit.algo import ADV_ESTIMATORS, KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGG, POLICY_LOSSES

    return {
        "algorithm.adv_estimator": ADV_ESTIMATORS,
        "actor_rollout_ref.actor.policy_loss": POLICY_LOSSES,
        "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG,
        "critic.loss_agg_mode": LOSS_AGG,
        "actor_rollout_ref.actor.kl_loss_type": KL_ESTIMATORS,
        "algorithm.kl_penalty": KL_ESTIMATORS,
        "algorithm.kl_ctrl.type": KL_CONTROLLERS,
    }


def config_value(cfg: Any, key: str) -> Any:
    """The value at a dotted config key."""
    return reduce(getattr, key.split("."), cfg)


def _kl_needs(cfg: RLConfig) -> tuple[str, Needs]:
    """A KL term (loss or in-reward) reads the reference log-probs; these are switches, not registry entries."""
    for key in ("actor_rollout_ref.actor.use_kl_loss", "algorithm.use_kl_in_reward"):
        if config_value(cfg, key):
            return f"{key}=true", Needs(ref=True)
    return "no KL term", Needs()


def declared_needs(cfg: RLConfig) -> list[tuple[str, Needs]]:
    """('key=name', Needs) of each configured algorithm entry and KL switch (messages name the source)."""
    out = []
    for key, registry in algorithm_registries().items():
        name = config_value(cfg, key)
        if name in registry:
            out.append((f"{key}={name}", needs_of(registry, name)))
    return [*out, _kl_needs(cfg)]


def run_needs(cfg: RLConfig) -> Needs:
    """What this run must provide: the union of the needs of its estimator, losses and KL switches."""
    total = Needs()
    for _, declared in declared_needs(cfg):
        total = total | Needs(**{k: getattr(declared, k) for k in NEED_WORDS})
    return total


def critic_enabled(cfg: RLConfig) -> bool:
    """`critic.enable`, or (when null) whether an entry needs values."""
    if cfg.critic.enable is not None:
        return bool(cfg.critic.enable)
    return run_needs(cfg).values


def ref_needed(cfg: RLConfig) -> bool:
    """The frozen reference is only built when a KL term or an entry reads its log-probs."""
    return run_needs(cfg).ref


def check_algorithm(cfg: RLConfig) -> None:
    """What each configured entry needs can be provided (names are checked before, with the other registries)."""
    for key in ("actor_rollout_ref.actor.loss_agg_mode", "critic.loss_agg_mode"):
        mode = config_value(cfg, key)
        try:
            agg_unit(mode)
        except UserError as exc:
            raise UserError(f"{key}={mode}: {exc}") from None
    n = cfg.actor_rollout_ref.rollout.n
    for source, declared in declared_needs(cfg):
        if declared.values and cfg.critic.enable is False:
            raise UserError(f"{source} needs {NEED_WORDS['values']}: set critic.enable=true (or leave it null)")
        if declared.groups and n < 2:
            raise UserError(f"{source} compares samples of the same prompt: "
                            f"set actor_rollout_ref.rollout.n >= 2 (now {n})")
