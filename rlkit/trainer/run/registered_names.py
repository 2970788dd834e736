"""Config keys whose value names a registry entry, checked against that registry (never a copied list).

The config layer imports no registry owner, so this table sits above all of them: each key names the registry its
value must be in as "module:NAME" (a registry fills itself with its built-in entries at its first lookup:
rlkit/registry.py `fill`). `check_named_entries` runs with the config checks; `docs/config.md` lists each key's
registered names from the same table.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlkit.errors import UserError
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

#: config key -> the registry its value (or each item of its list) must be in; the algorithm keys come from
#: rlkit.algo.run_needs.algorithm_registries()
REGISTERED_KEYS: dict[str, str] = {
    "data.truncation": "rlkit.data.truncation:TRUNCATION",
    "actor_rollout_ref.rollout.name": "rlkit.rollout.base:ROLLOUT_BACKENDS",
    "actor_rollout_ref.rollout.mode": "rlkit.rollout.agent.engine:ENGINE_SERVERS",
    "reward_model.reward_manager": "rlkit.reward.registry:REWARD_MANAGERS",
    "reward_model.style": "rlkit.reward.model_styles:REWARD_MODEL_STYLES",
    "trainer.logger": "rlkit.utils.tracker_base:TRACKERS",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "rlkit.utils.lr_schedule:LR_SCHEDULES",
    "critic.optim.lr_scheduler_type": "rlkit.utils.lr_schedule:LR_SCHEDULES",
    "distillation.distillation_loss.loss_mode": "rlkit.algo.distill_loss:DISTILL_LOSSES",
    "distillation.distillation_loss.policy_loss_mode": "rlkit.algo.policy_loss:POLICY_LOSSES",
}


def registries() -> dict[str, Registry[Any]]:
    """Config key -> the registry its value must be in."""
    from rlkit.algo.run_needs import algorithm_registries

    found: dict[str, Registry[Any]] = {}
    for key, where in REGISTERED_KEYS.items():
        module, _, name = where.partition(":")
        found[key] = getattr(importlib.import_module(module), name)
    return {**found, **algorithm_registries()}


def registered_names(key: str, builtin_only: bool = False) -> list[str] | None:
    """The names a key accepts (None: the key names no registry); `builtin_only` leaves plugins out."""
    registry = registries().get(key)
    if registry is None:
        return None
    return registry.builtin_names() if builtin_only else registry.names()


def check_registered_names(cfg: RLConfig) -> None:
    """UserError naming the key and the registered names for the first value that is not registered."""
    from rlkit.algo.run_needs import config_value

    for key, registry in registries().items():
        value = config_value(cfg, key)
        if value is None:  # e.g. rollout.name before finalize picks the default backend
            continue
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
