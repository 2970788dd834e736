"""Finalize a composed config: derived values, mode fix-ups, then every check, so what `--dry-run` prints is what runs.

Nothing downstream patches the config at run time: the layout builder, the trainer and the
workers read the finalized values (e.g. one-step-off-policy's rollout log-probs are on in the
printed config, not switched on later by the trainer).

`rlkit.config` imports no other rlkit layer. What only a layer above knows (is vLLM installed,
which names a registry holds, what an advantage estimator needs, which debug phases exist)
comes in as hooks: functions that fill in or check a config, passed by the caller
(`rlkit.trainer.run.run_config.HOOKS` for `rlkit train`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlkit.config.bounds import check_bounds
from rlkit.config.checkpoint_contents import settle_contents
from rlkit.config.checks import check_config
from rlkit.config.distillation import check_distillation
from rlkit.config.lora_section import settle_lora_section
from rlkit.config.micro_batch_sizes import settle_micro_batches
from rlkit.config.model_overrides import settle_model_overrides
from rlkit.config.optim import settle_optim
from rlkit.config.resume import settle_resume
from rlkit.config.rollout_correction import check_rollout_correction, settle_rollout_correction
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError

ConfigHook = Callable[[RLConfig], None]
#: data.seed=null: the data order seed rlkit has always used (not trainer.seed, so the order stays put when it moves)
DEFAULT_DATA_SEED = 1


def derive(cfg: RLConfig) -> None:
    """Values that follow from others: engine lengths from the data, clip bounds, the critic's defaults, every
    pass's micro-batching (null = the actor's, global sizes per worker)."""
    settle_lora_section(cfg.actor_rollout_ref.model)  # verl's model.lora.* onto lora_rank/... (read just below)
    settle_model_overrides(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout)  # model.override_config
    rollout = cfg.actor_rollout_ref.rollout
    rollout.prompt_length = cfg.data.max_prompt_length
    rollout.response_length = cfg.data.max_response_length
    rollout.max_lora_rank = cfg.actor_rollout_ref.model.lora_rank
    rollout.chat_template_kwargs = dict(cfg.data.apply_chat_template_kwargs)
    data = cfg.data
    if data.gen_batch_size is None:
        data.gen_batch_size = data.train_batch_size
    for key in ("train_max_samples", "val_max_samples"):  # verl's -1 and rlkit's null both mean every row
        if getattr(data, key) == -1:
            setattr(data, key, None)
    if data.seed is None:
        data.seed = DEFAULT_DATA_SEED
    rollout.batch_rows = min(rollout.max_num_seqs, data.gen_batch_size * rollout.n)
    rollout.mm_processor_kwargs = dict(data.mm_processor_kwargs)  # the engine processes images as the trainer does
    actor = cfg.actor_rollout_ref.actor
    if actor.clip_ratio_low is None:
        actor.clip_ratio_low = actor.clip_ratio
    if actor.clip_ratio_high is None:
        actor.clip_ratio_high = actor.clip_ratio
    ref = cfg.actor_rollout_ref.ref
    if ref.fsdp_config.tensor_parallel_size == 1:  # the reference (and the teachers, as it) follow the actor's TP
        ref.fsdp_config.tensor_parallel_size = actor.fsdp_config.tensor_parallel_size
    if ref.fsdp_config.expert_parallel_size == 1:  # and its EP
        ref.fsdp_config.expert_parallel_size = actor.fsdp_config.expert_parallel_size
    critic = cfg.critic
    if critic.ppo_mini_batch_size is None:
        critic.ppo_mini_batch_size = actor.ppo_mini_batch_size
    if critic.ppo_epochs is None:
        critic.ppo_epochs = actor.ppo_epochs
    if critic.model.path is None:
        critic.model.path = cfg.actor_rollout_ref.model.path
    settle_optim(actor.optim, "actor_rollout_ref.actor.optim")
    settle_contents(actor.checkpoint, "actor_rollout_ref.actor.checkpoint")
    settle_contents(critic.checkpoint, "critic.checkpoint")
    if critic.enable is not False:
        settle_optim(critic.optim, "critic.optim")
    settle_micro_batches(cfg)
    settle_rollout_correction(cfg)  # algorithm.rollout_is/rollout_rs: a level name or None, rejection bounds
    settle_pf_ppo_and_is_norm(cfg)
    settle_resume(cfg.trainer)  # verl's resume_mode=resume_path + resume_from_path
    if isinstance(cfg.trainer.logger, str):  # verl's one-name form: trainer.logger=console
        cfg.trainer.logger = [cfg.trainer.logger]


def settle_pf_ppo_and_is_norm(cfg: RLConfig) -> None:
    """PF-PPO resamples GAE batches only (as verl); batch-normalised IS weights need the old log-probs before the
    update (their mean over the whole batch), so the old-log-prob forward runs."""
    algo = cfg.algorithm
    if algo.use_pf_ppo and algo.adv_estimator != "gae":
        raise UserError(f"algorithm.use_pf_ppo=true resamples GAE batches (verl applies it only with "
                        f"adv_estimator=gae; with {algo.adv_estimator} it does nothing): set use_pf_ppo=false or "
                        "algorithm.adv_estimator=gae")
    if algo.rollout_is_batch_normalize and algo.rollout_is:
        cfg.actor_rollout_ref.actor.recompute_old_log_prob = True


def apply_modes(cfg: RLConfig) -> None:
    """What a run mode implies for other keys.

    `trainer.one_step_off_policy` (the rollout runs one batch ahead on a worker group of its own) and
    `trainer.fully_async` (a separate rollout group streams samples into a buffer, at most
    `trainer.staleness_threshold` policy versions old): the engine returns its log-probs and the loss
    corrects for the lag with truncated importance sampling (`algorithm.rollout_is`: token unless a
    level is set); the engine never sleeps (its processes hold nothing else, so there is nothing to
    hand back); dynamic sampling is not supported. The two modes exclude each other.
    """
    t = cfg.trainer
    transfers = ("broadcast", "object_store")
    if cfg.actor_rollout_ref.rollout.weight_transfer not in transfers:
        raise UserError(f"actor_rollout_ref.rollout.weight_transfer={cfg.actor_rollout_ref.rollout.weight_transfer!r}"
                        f": use one of {', '.join(transfers)}")
    if not t.separate_rollout:
        if cfg.actor_rollout_ref.rollout.nnodes > 0:
            raise UserError("actor_rollout_ref.rollout.nnodes puts the engines on nodes of their own, which only "
                            "separate engines have: set trainer.one_step_off_policy=true (or trainer.fully_async=true)"
                            " or drop rollout.nnodes (the colocated engines share the actor's workers)")
        return
    if t.one_step_off_policy and t.fully_async:
        raise UserError("trainer.one_step_off_policy and trainer.fully_async are two async modes; pick one (fully "
                        "async with trainer.staleness_threshold=1 bounds the lag as one-step-off does)")
    mode = "trainer.fully_async" if t.fully_async else "trainer.one_step_off_policy"
    if cfg.algorithm.filter_groups.enable:
        raise UserError(f"{mode} does not support algorithm.filter_groups (dynamic sampling); turn one of them off")
    rollout = cfg.actor_rollout_ref.rollout
    if t.fully_async:
        check_fully_async(cfg)
    rollout.calculate_log_probs = True
    cfg.algorithm.rollout_is = cfg.algorithm.rollout_is or "token"
    rollout.free_cache_engine = False


def check_fully_async(cfg: RLConfig) -> None:
    """Keys `trainer.fully_async` cannot run with; each message names the fix."""
    t, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    if cfg.data.train_batch_size % t.rollout_chunk_prompts:
        raise UserError(f"trainer.rollout_chunk_prompts={t.rollout_chunk_prompts} must divide data.train_batch_size="
                        f"{cfg.data.train_batch_size} (a batch is whole chunks); e.g. trainer.rollout_chunk_prompts=1")
    if t.critic_warmup:
        raise UserError(f"trainer.critic_warmup={t.critic_warmup}: with trainer.fully_async the rollout pump counts "
                        "policy versions by weight pushes, which the warm-up skips; set trainer.critic_warmup=0 or "
                        "use trainer.one_step_off_policy")
    if t.partial_rollout_segment and rollout.multi_turn.enable:
        raise UserError("trainer.partial_rollout_segment: multi-turn rollouts (rollout.multi_turn.enable) run whole "
                        "episodes per request; set trainer.partial_rollout_segment=0")
    if t.partial_rollout_segment and cfg.actor_rollout_ref.actor.router_replay:
        raise UserError("trainer.partial_rollout_segment: actor.router_replay needs each response's routes from one "
                        "request; set trainer.partial_rollout_segment=0")


def check_lora(cfg: RLConfig) -> None:
    """LoRA keys (docs/lora.md): a rank >= 0, and the native sync only where the engine loads adapters."""
    model, rollout = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout
    if model.lora_rank < 0:
        raise UserError(f"actor_rollout_ref.model.lora_rank={model.lora_rank} must be >= 0 (0 = full fine-tuning)")
    lora = model.lora_rank > 0 or bool(model.lora_adapter_path)
    if lora and rollout.lora_sync == "native" and rollout.name not in (None, "vllm"):
        raise UserError(f"actor_rollout_ref.rollout.lora_sync=native needs the vllm engine (rollout.name="
                        f"{rollout.name} cannot load LoRA adapters); use lora_sync=merge")
    if lora and rollout.lora_sync == "native" and cfg.trainer.separate_rollout:
        raise UserError("actor_rollout_ref.rollout.lora_sync=native is for the colocated engine; with "
                        "trainer.one_step_off_policy or fully_async the separate engine receives the merged "
                        "weights through the object store: use lora_sync=merge (the default)")
    if lora and rollout.lora_sync == "native" and model.lora_rank == 0:
        raise UserError("actor_rollout_ref.rollout.lora_sync=native sizes the engine's LoRA slots from "
                        "actor_rollout_ref.model.lora_rank: set it to the adapter's rank (lora_adapter_path)")


def check_record_steps(cfg: RLConfig) -> None:
    """trainer.debug.record_steps: step numbers (>= 1), kept sorted, each once."""
    debug = cfg.trainer.debug
    steps = list(debug.record_steps)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in steps):
        raise UserError(f"trainer.debug.record_steps: expected step numbers >= 1, got {steps}; e.g. "
                        "trainer.debug.record_steps=[3,4]")
    debug.record_steps = sorted(set(steps))


def finalize(cfg: RLConfig, hooks: Sequence[ConfigHook]) -> RLConfig:
    """Fill derived values, run the hooks, check that the sizes fit together; UserError saying what to change."""
    check_bounds(cfg)  # single values first: their messages name the key the user wrote
    check_record_steps(cfg)
    derive(cfg)
    apply_modes(cfg)
    cfg.actor_rollout_ref.rollout.validate()
    for hook in hooks:
        hook(cfg)
    check_lora(cfg)
    check_rollout_correction(cfg)
    check_distillation(cfg.distillation, cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
    check_config(cfg)
    return cfg
