"""What an algorithm entry needs, declared next to its registration, read by everyone who provides it.

Advantage estimators, policy losses and loss-aggregation modes say what they read with one
decorator under their `@REGISTRY.register(...)`:

    @ADV_ESTIMATORS.register("gae")
    @needs(values=True)
    def gae(...): ...

The config checks (a critic is on, n >= 2), the worker layout (build a critic / a reference),
the step (generate a greedy baseline) and the micro-batch loss scales (the aggregation unit)
read these declarations through `needs_of` / `rlkit.algo.run_needs`; none of them knows an entry's name,
so a newly registered entry needs no edit anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch

from rlkit.registry import Registry

T = TypeVar("T")
Unit = Callable[[torch.Tensor], torch.Tensor]  # (B, R) mask -> how many things a loss averages over


@dataclass(frozen=True)
class Needs:
    """Inputs an entry reads beyond the batch every step has (rewards, log-probs, the response mask)."""

    values: bool = False  # critic `values` (B, R): a value model is built and trained
    groups: bool = False  # several samples per prompt (`index`/uid): actor_rollout_ref.rollout.n >= 2
    ref: bool = False  # `ref_log_prob` (B, R) of the frozen reference policy: the reference model is built
    greedy_baseline: bool = False  # `reward_baselines` (B,): the reward of one greedy response per prompt
    sum_pi_squared: bool = False  # `sum_pi_squared` (B, R): sum_v pi_v^2 per token from the old-log-prob forward
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
    "sum_pi_squared": "sum_v pi_v^2 per token from the actor's log-prob forward",
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


def summed(mask: torch.Tensor) -> torch.Tensor:
    """A plain sum (token-sum) has no normaliser: micro-batch losses add up as they are (`loss_scales`)."""
    return mask.new_ones(())
