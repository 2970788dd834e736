"""What one run needs, from its config: the union of the `@needs` declarations of the entries it names.

Above every registry of the package (it reads them all), so the registries' modules can import
`rlkit.algo.needs` for the decorator without a cycle.
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any

from rlkit.algo.advantages import ADV_ESTIMATORS
from rlkit.algo.kl import KL_CONTROLLERS, KL_ESTIMATORS
from rlkit.algo.loss_agg import LOSS_AGG
from rlkit.algo.needs import NEED_WORDS, Needs, Unit, needs_of
from rlkit.algo.policy_loss import POLICY_LOSSES
from rlkit.algo.rollout_correction import RATIO_LEVELS
from rlkit.config.rejection_modes import MODES
from rlkit.errors import UserError
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig


def agg_unit(mode: str) -> Unit:
    """The unit a registered loss-aggregation mode averages over; UserError if it declares none."""
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
    return {
        "algorithm.adv_estimator": ADV_ESTIMATORS,
        "actor_rollout_ref.actor.policy_loss": POLICY_LOSSES,
        "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG,
        "critic.loss_agg_mode": LOSS_AGG,
        "actor_rollout_ref.actor.kl_loss_type": KL_ESTIMATORS,
        "algorithm.kl_penalty": KL_ESTIMATORS,
        "algorithm.kl_ctrl.type": KL_CONTROLLERS,
        "algorithm.rollout_is": RATIO_LEVELS,
        "algorithm.rollout_rs": rejection_names(),
    }


def rejection_names() -> Registry[Any]:
    """What `algorithm.rollout_rs` may name: an rlkit level (RATIO_LEVELS) or verl's modes (a list of them)."""
    names: Registry[Any] = Registry("rollout rejection level or mode")
    for name in RATIO_LEVELS.names():
        names.add(name, RATIO_LEVELS.get(name))
    for mode in MODES:
        names.add(mode, mode)
    return names


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
        value = config_value(cfg, key)
        for name in value if isinstance(value, list) else [value]:  # a list: verl's rejection modes
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
        if declared.sum_pi_squared and cfg.algorithm.bypass_mode:  # bypass skips the one forward that computes it
            raise UserError(f"{source} needs {NEED_WORDS['sum_pi_squared']}, which algorithm.bypass_mode=true skips: "
                            "set algorithm.bypass_mode=false (algorithm.rollout_is weighs the engine gap instead)")
        if declared.groups and n < 2:
            raise UserError(f"{source} compares samples of the same prompt: "
                            f"set actor_rollout_ref.rollout.n >= 2 (now {n})")
