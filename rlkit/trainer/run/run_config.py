"""The run config of `rlkit train`: rlkit.config's composition, finalized with what only the layers above it know.

`rlkit.config` imports no other rlkit layer, so its `finalize` takes the facts and checks it
cannot make itself as hooks, and this module (the launcher's layer, which sees them all)
passes them: the default rollout backend (is vLLM installed?), the break-at phases, the
registries' names (the user's plugins first), the algorithm entries' needs (critic on, n >= 2),
the reward manager, which backends can run tensor-parallel and the agent's tool names.

    cfg = load_config("grpo", ["actor_rollout_ref.rollout.n=8"])

`python -m rlkit.trainer.run.run_config > docs/config.md` regenerates the config reference.
"""

from __future__ import annotations

from rlkit.config.doc import render
from rlkit.config.finalize import ConfigHook, finalize
from rlkit.config.load import compose_config
from rlkit.config.schema import RLConfig


def default_rollout_backend(cfg: RLConfig) -> None:
    """`rollout.name: null` -> vllm where installed, else hf."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name is None:
        from rlkit.rollout import default_backend_name

        rollout.name = default_backend_name()


def break_at_rules(cfg: RLConfig) -> None:
    """`trainer.debug.break_at` as a list of rules whose phases exist (rlkit.debug.breakpoints.PHASES)."""
    from rlkit.debug.breakpoints import break_at_list

    cfg.trainer.debug.break_at = break_at_list(cfg.trainer.debug.break_at)


def named_entries(cfg: RLConfig) -> None:
    """The user's plugins imported, every registry-valued key's name registered, the algorithm entries'
    declared needs met (then `critic.enable: null` becomes what they need), the reward manager's options."""
    from rlkit.algo.run_needs import critic_enabled
    from rlkit.trainer.run.registered_names import check_named_entries

    check_named_entries(cfg)
    cfg.critic.enable = critic_enabled(cfg)


def tensor_parallel_backend(cfg: RLConfig) -> None:
    from rlkit.config.checks import check_tensor_parallel
    from rlkit.rollout import tensor_parallel_backends

    check_tensor_parallel(cfg, tensor_parallel_backends())


def router_replay_backend(cfg: RLConfig) -> None:
    """`actor.router_replay` of the rollout's routes needs a backend that returns them, and no agent loop (it does
    not record routes yet); vLLM 0.32 returns none on CPU (docs/moe.md). The old-log-prob pass's routes (R2) need
    neither."""
    from rlkit.errors import UserError
    from rlkit.rollout import route_returning_backends

    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    sources = ("rollout", "old_log_prob")
    if actor.router_replay_from not in sources:
        raise UserError(f"actor_rollout_ref.actor.router_replay_from={actor.router_replay_from!r}: use one of "
                        f"{', '.join(sources)}")
    if not actor.router_replay or actor.router_replay_from == "old_log_prob":  # R2 needs nothing of the engine
        return
    able = route_returning_backends()
    if rollout.name not in able:
        raise UserError(f"actor_rollout_ref.actor.router_replay=true needs the experts the engine chose for each "
                        f"token; the '{rollout.name}' backend does not return them (docs/moe.md): set "
                        f"actor_rollout_ref.rollout.name={' | '.join(able)} or router_replay=false")
    if rollout.multi_turn.enable:
        raise UserError("actor_rollout_ref.actor.router_replay=true: the multi-turn agent loop does not record "
                        "routes yet; turn off rollout.multi_turn.enable or router_replay")


def async_baseline(cfg: RLConfig) -> None:
    """The fully async pump generates no greedy baseline: an estimator that needs one (ReMax) is refused."""
    from rlkit.algo.run_needs import run_needs
    from rlkit.errors import UserError

    if cfg.trainer.fully_async and run_needs(cfg).greedy_baseline:
        raise UserError(
            f"trainer.fully_async does not generate the greedy baseline responses "
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs; use "
            "trainer.one_step_off_policy=true instead of trainer.fully_async"
        )


def agent_names(cfg: RLConfig) -> None:
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if multi_turn.enable:
        from rlkit.rollout.agent.check import check_multi_turn

        check_multi_turn(multi_turn)


#: in order: the backend default before the tensor-parallel check; all run before the config's own
#: checks, which read the resolved `critic.enable`
HOOKS: tuple[ConfigHook, ...] = (
    default_rollout_backend, break_at_rules, named_entries, tensor_parallel_backend, router_replay_backend,
    async_baseline, agent_names,
)


def load_config(algo: str | None = "grpo", overrides: list[str] | None = None, config_file: str | None = None,
                config_path: str | None = None, config_name: str | None = None,
                notices: list[str] | None = None) -> RLConfig:
    """The validated, finalized RLConfig of `rlkit train [ALGO] [--config FILE | --config-path DIR --config-name NAME]
    [override ...]` (see rlkit.config.load.compose_config for the grammar; `notices` gets the verl-key lines)."""
    cfg = compose_config(algo, overrides, config_file, config_path=config_path, config_name=config_name,
                         notices=notices)
    return finalize(cfg, HOOKS)


def reference() -> str:
    """docs/config.md: the schema reference, each registry-named key listing its registered names."""
    from rlkit.trainer.run.registered_names import registered_names

    return render(lambda key: registered_names(key, builtin_only=True))  # a user's plugins stay out of the docs


if __name__ == "__main__":
    print(reference(), end="")
