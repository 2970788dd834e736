"""Config keys whose value names a registry entry, checked against that registry (never a copied list).

The config layer imports no registry owner, so this table sits above all of them: the
algorithm entries (rlkit.algo.needs), the data truncation modes, the rollout backends,
the reward managers, the trackers and the lr schedules. `check_named_entries` runs with the config
checks; `docs/config.md` lists each key's registered names from the same table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig


def _truncation() -> Registry[Any]:
    from rlkit.data.truncation import TRUNCATION

    return TRUNCATION


def _rollout() -> Registry[Any]:
    from rlkit.rollout import ROLLOUT_BACKENDS  # the package import registers every backend

    return ROLLOUT_BACKENDS


def _rollout_modes() -> Registry[Any]:
    import rlkit.rollout.agent.continuous  # noqa: F401  (registers mode "async" beside "sync")
    from rlkit.rollout.agent.engine import ENGINE_SERVERS

    return ENGINE_SERVERS


def _reward() -> Registry[Any]:
    from rlkit.reward.registry import REWARD_MANAGERS, load_builtin_managers

    load_builtin_managers()
    return REWARD_MANAGERS


def _reward_model_styles() -> Registry[Any]:
    from rlkit.reward.model_styles import REWARD_MODEL_STYLES

    return REWARD_MODEL_STYLES


def _lr_schedules() -> Registry[Any]:
    from rlkit.utils.lr_schedule import LR_SCHEDULES

    return LR_SCHEDULES


def _trackers() -> Registry[Any]:
    import rlkit.utils.tracking  # noqa: F401  (registers every built-in tracker)
    from rlkit.utils.tracker_base import TRACKERS

    return TRACKERS


def _distill_losses() -> Registry[Any]:
    from rlkit.algo.distill_loss import DISTILL_LOSSES

    return DISTILL_LOSSES


def _policy_losses() -> Registry[Any]:
    from rlkit.algo.policy_loss import POLICY_LOSSES

    return POLICY_LOSSES


def registered_keys() -> dict[str, Callable[[], Registry[Any]]]:
    """Config key -> a loader of the registry its value (or each item of its list) must be in."""
    from rlkit.algo.run_needs import algorithm_registries

    keys: dict[str, Callable[[], Registry[Any]]] = {
        "data.truncation": _truncation,
        "actor_rollout_ref.rollout.name": _rollout,
        "actor_rollout_ref.rollout.mode": _rollout_modes,
        "reward_model.reward_manager": _reward,
        "reward_model.style": _reward_model_styles,
        "trainer.logger": _trackers,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": _lr_schedules,
        "critic.optim.lr_scheduler_type": _lr_schedules,
        "distillation.distillation_loss.loss_mode": _distill_losses,
        "distillation.distillation_loss.policy_loss_mode": _policy_losses,
    }
    for key, registry in algorithm_registries().items():
        keys[key] = lambda registry=registry: registry
    return keys


def registered_names(key: str, builtin_only: bool = False) -> list[str] | None:
    """The names a key accepts (None: the key names no registry); `builtin_only` leaves plugins out."""
    loader = registered_keys().get(key)
    if loader is None:
        return None
    return loader().builtin_names() if builtin_only else loader().names()


def check_registered_names(cfg: RLConfig) -> None:
    """UserError naming the key and the registered names for the first value that is not registered."""
    from rlkit.algo.run_needs import config_value

    for key, loader in registered_keys().items():
        value = config_value(cfg, key)
        if value is None:  # e.g. rollout.name before finalize picks the default backend
            continue
        registry = loader()
        for name in value if isinstance(value, (list, tuple)) else [value]:
            if name not in registry:
                raise UserError(f"{key}='{name}' is not registered; choose one of {registry.names()}")


def check_named_entries(cfg: RLConfig) -> None:
    """Everything the config checks ask of the registries, in one call (the config layer's one hook upward):
    plugins imported, every name registered, each algorithm entry's needs met, the reward manager's options,
    the model reward's style and mix weights."""
    from rlkit.algo.run_needs import check_algorithm
    from rlkit.registry import import_plugins
    from rlkit.reward.mix import check_reward_model
    from rlkit.reward.registry import check_reward_manager

    import_plugins(cfg.trainer.plugins)  # their registrations first: the names below may be theirs
    check_registered_names(cfg)
    check_algorithm(cfg)
    check_reward_manager(cfg)
    check_reward_model(cfg)
