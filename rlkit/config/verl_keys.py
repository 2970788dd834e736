"""verl's config keys that rlkit's schema does not hold under verl's name, each as one rule (rlkit.config.verl_rules).

Keys rlkit implements under verl's own name live in the schema (schema.py and its sections); the rules below are
the rest of verl's key space (both layouts: the current one with `reward.*`, and the older one most published scripts
use, with `reward_model.*` / `reward_manager.*` at the top level), first match wins. `docs/verl.md` is generated
from this table (`python -m rlkit.config.verl_doc`).
"""

from __future__ import annotations

from rlkit.config.lora_section import lora_rules
from rlkit.config.trl_loss_types import trl_loss_type
from rlkit.config.verl_compute_rules import served_reward_model_rules, veomni_rules
from rlkit.config.verl_role_keys import (
    ACTOR,
    ANY,
    ARR,
    DETERMINISM_OFF,
    FSDP2,
    MODEL,
    OTHER_ENGINE,
    PROFILER_OFF,
    REF,
    REPLAY_OFF,
    ROLLOUT,
    drop_other_engines,
    fsdp_rules,
    full_determinism,
    global_profiler_rules,
    megatron_rules,
    model_rules,
    names_other_engine,
    optim_rules,
    profiler_cannot_run,
    profiler_rules,
    profiler_tool,
    role_common,
    rollout_engine,
    router_replay,
    strategy,
)
from rlkit.config.verl_rules import VerlKey, alias, mapped, only, refused


def _rules() -> list[VerlKey]:
    rules: list[VerlKey] = []
    # --- strategies and engines, whatever the role
    rules += [
        mapped(f"{ARR}.{{actor,ref}}.strategy", FSDP2, derive=strategy),
        mapped("{critic,reward_model}.strategy", FSDP2, derive=strategy),
        mapped("model_engine", FSDP2, derive=strategy),
        mapped(f"{ROLLOUT}.name", "the vLLM engine", derive=rollout_engine,
               when=lambda v: str(v).lower() in ("sglang", "trtllm")),
        mapped(f"{ARR}.hybrid_engine", "nothing to set: the actor, rollout and reference share one process per "
               "device in rlkit (the same computation); a rollout group of its own is trainer.one_step_off_policy"),
        mapped(f"{ARR}.nccl_timeout", "nothing to set: torch.distributed's default timeout applies"),
    ]
    # --- actor
    rules += fsdp_rules(f"{ACTOR}.fsdp_config", ACTOR) + megatron_rules(f"{ACTOR}.megatron", ACTOR, MODEL)
    rules += optim_rules(f"{ACTOR}.optim", ACTOR) + role_common(ACTOR, ACTOR)
    rules += veomni_rules(f"{ACTOR}.veomni", ACTOR, strategy, router_replay(f"{ACTOR}.router_replay"))
    rules += [
        alias(f"{ACTOR}.policy_loss.loss_mode", f"{ACTOR}.policy_loss"),
        alias(f"{ACTOR}.policy_loss.{{clip_cov_ratio,clip_cov_lb,clip_cov_ub,kl_cov_ratio,ppo_kl_coef,dro_beta}}",
              f"{ACTOR}.{{1}}", why=f"= {ACTOR}.<the same name> (rlkit's policy_loss is the loss's name)"),
        mapped(f"{ACTOR}.loss_type", "TRL's GRPOConfig.loss_type", derive=trl_loss_type),
        alias(f"{ACTOR}.use_torch_compile", f"{MODEL}.use_torch_compile"),
        alias(f"{ACTOR}.use_fused_kernels", f"{MODEL}.fused_lm_head"),
        alias(f"{ACTOR}.use_remove_padding", f"{MODEL}.use_remove_padding"),
        alias(f"{ACTOR}.entropy_from_logits_chunk_size", f"{ACTOR}.logits_chunk_size"),
        mapped(f"{ACTOR}.entropy_from_logits_with_chunking", "nothing to set: rlkit always computes log-probs and "
               "entropy in chunks of actor.logits_chunk_size rows"),
        mapped(f"{ACTOR}.entropy_checkpointing", "nothing to set: off", derive=lambda v, k: (
            {f"{MODEL}.fused_lm_head": True}, f"{MODEL}.fused_lm_head=true (log-probs and entropy recomputed in "
            "backward, no logits kept)") if v else ({}, "")),
        mapped(f"{ACTOR}.calculate_entropy", "nothing to set: rlkit computes the entropy in every update "
               "(actor/entropy)"),
        mapped(f"{ACTOR}.calculate_sum_pi_squared", "nothing to set: the actor's old-log-prob forward computes "
               "sum_pi_squared exactly when algorithm.adv_estimator reads it (the optimal token baselines)"),
        mapped(f"{ACTOR}.sum_pi_squared_checkpointing", "nothing to set: rlkit computes sum_pi_squared only in the "
               "no-grad old-log-prob forward, chunk by chunk, so nothing is kept for backward"),
        mapped(f"{ACTOR}.use_prefix_grouper", "nothing to set: each sample's forward runs its own copy of the shared "
               "prompt instead of one per group (verl's prefix grouper saves that compute); the log-probs are the "
               "same"),
        mapped(f"{ACTOR}.router_replay.mode", REPLAY_OFF, derive=router_replay(f"{ACTOR}.router_replay")),
        refused(f"{ACTOR}.qat.**", "quantisation-aware training is not in rlkit; remove qat.*", switch="enable"),
    ]
    # --- reference
    rules += fsdp_rules(f"{REF}.fsdp_config", REF) + megatron_rules(f"{REF}.megatron", REF, MODEL)
    rules += role_common(REF, REF)
    rules += veomni_rules(f"{REF}.veomni", REF, strategy, router_replay(f"{ACTOR}.router_replay"))
    rules += [
        mapped(f"{REF}.{{use_torch_compile,entropy_from_logits_with_chunking,entropy_from_logits_chunk_size,"
               "entropy_checkpointing}", "nothing to set: the reference computes as the actor's keys say"),
        mapped(f"{REF}.router_replay.mode", REPLAY_OFF, derive=router_replay(f"{ACTOR}.router_replay")),
    ]
    # --- rollout
    rules += role_common(ROLLOUT, ROLLOUT)
    rules += [
        refused(f"{ROLLOUT}.agent.default_agent_loop", "rlkit's loops: plain generation, or the tool agent with "
                "rollout.multi_turn.enable=true", inert=only("single_turn_agent")),
        mapped(f"{ROLLOUT}.agent.num_workers", "nothing to set: rlkit's agent loop runs inside each rollout worker"),
        refused(f"{ROLLOUT}.agent.{{agent_loop_config_path}}", "custom agent loops: register one in a module named "
                "in trainer.plugins (rlkit.rollout.agent registries; docs/agents.md)"),
        refused(f"{ROLLOUT}.agent.custom_async_server.**", "custom async servers are not in rlkit; use "
                "multi_turn.external_agent for an agent against rlkit's OpenAI endpoint", switch="path"),
        mapped(f"{ROLLOUT}.checkpoint_engine.{{backend,engine_kwargs,custom_backend_module}}", "nothing to set: "
               "rlkit syncs weights in memory (colocated) or, to separate engines, by a gloo/NCCL broadcast from the "
               "actor's rank 0 in buckets (rollout.weight_transfer)"),
        alias(f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes",
              f"{ROLLOUT}.update_weights_bucket_megabytes"),
        mapped(f"{ROLLOUT}.engine_kwargs", OTHER_ENGINE, derive=drop_other_engines, when=names_other_engine),
        mapped(f"{ROLLOUT}.engine_kwargs.{{sglang,trtllm}}", OTHER_ENGINE, when=bool),
        mapped(f"{ROLLOUT}.engine_kwargs.{{sglang,trtllm}}.**", OTHER_ENGINE, when=ANY),
        mapped(f"{ROLLOUT}.sglang_rollout_mode", "nothing to set: rlkit's vLLM engine runs inside each rollout worker "
               "(no SGLang server mode); the samples are the same"),
        mapped(f"{ROLLOUT}.server.**", "nothing to set: the SGLang server mode's HTTP client settings (timeouts, "
               "retries, connections); rlkit's engine is called in-process, with no server between"),
        mapped(f"{ROLLOUT}.cudagraph_capture_sizes", "nothing to set: vLLM chooses its CUDA-graph batch sizes "
               "(rollout.engine_kwargs.vllm.compilation_config sets them)"),
        mapped(f"{ROLLOUT}.{{data_parallel_size,expert_parallel_size,pipeline_model_parallel_size}}",
               "nothing to set: rlkit runs one engine per tensor-parallel group of workers "
               "(rollout.tensor_model_parallel_size); the split changes speed, not the samples"),
        mapped(f"{ROLLOUT}.disaggregation.**", "nothing to set: prefill and decode run in one vLLM engine"),
        alias(f"{ROLLOUT}.enable_rollout_routing_replay", f"{ACTOR}.router_replay"),
        mapped(f"{ROLLOUT}.full_determinism", DETERMINISM_OFF, derive=full_determinism),
        mapped(f"{ROLLOUT}.over_sample_rate", "nothing to set: verl reads it nowhere since 2025-12 (it was the "
               "early abort of the last requests of SGLang's removed sync mode); every sample is generated, as in "
               "verl"),
        refused(f"{ROLLOUT}.{{skip_rollout,quantization,"
                "quantization_config_file,mtp,qat}",
                "not in rlkit's rollout; remove it"),
        mapped(f"{ROLLOUT}.moe_load_balance_metrics_interval", "nothing to set: the engine's expert-load metrics are "
               "not collected (the trainer logs its own MoE metrics)"),
        mapped(f"{ROLLOUT}.{{layered_summon,multi_stage_wake_up,skip_tokenizer_init,skip_dump_dir}}",
               "nothing to set: rlkit streams the FSDP state dict layer by layer into the engine and wakes it in "
               "one step on CPU and GPU alike"),
        refused(f"{ROLLOUT}.logprobs_mode", "rlkit's rollout log-probs are of the processed (temperature-scaled) "
                "distribution the tokens were sampled from", inert=only("processed_logprobs")),
        mapped(f"{ROLLOUT}.prometheus.**", "nothing to set: the engine's own Prometheus exporter is not started; "
               "the trackers get every rollout metric (a run's /metrics endpoint: trainer.prometheus)"),
        mapped(f"{ROLLOUT}.scheduling_policy", "nothing to set: vLLM's scheduling stays first-come-first-served "
               "(the order requests are served in, not what is sampled)"),
        mapped(f"{ROLLOUT}.trace.**", "nothing to set: rollout traces (weave, mlflow) are not written; "
               "trainer.rollout_data_dir dumps the generations"),
        refused(f"{ROLLOUT}.multi_turn.{{function_tool_path,num_repeat_rollouts,use_inference_chat_template}}",
                "not in rlkit's agent loop; tools are registered in rlkit.rollout.agent.TOOLS (docs/agents.md)"),
        mapped(f"{ROLLOUT}.multi_turn.tokenization_sanity_check_mode", "nothing to set: rlkit's agent loop "
               "tokenises each turn once and appends, so no re-tokenisation check is needed"),
    ]
    # --- model
    rules += lora_rules(MODEL)  # before model_rules: the actor's lora.* section is read (the critic's is refused)
    rules += model_rules(MODEL)
    rules += [alias(f"{MODEL}.use_fused_kernels", f"{MODEL}.fused_lm_head")]
    # --- critic (the new layout's `critic.fsdp`, the older `critic.model.fsdp_config`)
    rules += fsdp_rules("critic.fsdp", "critic") + fsdp_rules("critic.model.fsdp_config", "critic")
    rules += megatron_rules("critic.megatron", "critic", "critic.model")
    rules += veomni_rules("critic.veomni", "critic", strategy, router_replay(f"{ACTOR}.router_replay"))
    rules += optim_rules("critic.optim", "critic") + role_common("critic", "critic") + model_rules("critic.model")
    rules += [
        refused("critic.model.lora_rank", "LoRA on the critic is not in rlkit; the critic trains all its weights",
                inert=only(0)),
        refused("critic.model.{lora_alpha,target_modules,exclude_modules,lora_adapter_path}", "read only with "
                "critic.model.lora_rank > 0, which rlkit refuses", inert=ANY),
        mapped("critic.model.{use_remove_padding,trust_remote_code,use_fused_kernels}", "nothing to set: the critic "
               "packs and loads as the actor_rollout_ref.model keys say"),
    ]
    # --- data
    rules += [
        alias("data.{tool_config_path}", f"{ROLLOUT}.multi_turn.tool_config_path"),
        refused("data.function_tool_path", "not in rlkit's agent loop; tools are registered in "
                "rlkit.rollout.agent.TOOLS (docs/agents.md)"),
        refused("data.tokenizer", "rlkit tokenises with the model's tokenizer (actor_rollout_ref.model.path)"),
        mapped("data.{use_shm,dataloader_num_workers}", "nothing to set: rlkit reads the parquet once into memory; "
               "there are no loader workers"),
        mapped("data.filter_overlong_prompts_workers", "nothing to set: rlkit tokenises every prompt once, in one "
               "batched call at load time, and filters on those lengths"),
        mapped("data.trust_remote_code", "nothing to set: the tokenizer loads with "
               "actor_rollout_ref.model.trust_remote_code"),
        refused("data.video_key", "videos are not in rlkit yet (images are: data.image_key); drop the videos "
                "column and remove the key", inert=only("videos")),
        refused("data.audio_key", "audio data is not in rlkit; train a text or vision-language model (remove the "
                "key)", inert=lambda v: False),
        refused("data.image_patch_size", "rlkit reads the patch size from the model folder's image processor "
                "(preprocessor_config.json: patch_size); set it there", inert=ANY),
        mapped("data.return_multi_modal_inputs", "nothing to set: rlkit always carries each row's processor "
               "output (multi_modal_inputs) for the trainer's forward"),
        mapped("data.{return_raw_input_ids,return_full_prompt}", "nothing to set: rlkit's batch carries the prompt "
               "ids and (data.return_raw_chat) the messages, from which a reward model renders its own input"),
        refused("data.datagen.**", "dynamic data generation is not in rlkit", switch="path"),
    ]
    # --- rewards: the current layout's `reward.*`, then the older top-level `reward_model.*` / `reward_manager.*`
    sandbox = ("nothing to set: code rewards run the same tests in rlkit's local sandbox (rlkit.sandbox) instead of "
               "a SandboxFusion server")
    rules += [
        alias("reward.custom_reward_function.{path,name}", "custom_reward_function.{1}"),
        alias("reward.num_workers", "reward_model.num_workers"),
        alias("reward.reward_manager.name", "reward_model.reward_manager"),
        refused("reward.reward_manager.source", "reward managers are looked up by name; register your own in a "
                "module named in trainer.plugins", inert=only("register")),
        refused("reward.reward_manager.module.**", "register your reward manager (rlkit.reward.REWARD_MANAGERS) in "
                "a module named in trainer.plugins", switch="path"),
        alias("reward.reward_model.{enable,enable_resource_pool,n_gpus_per_node,nnodes}", "reward_model.{1}"),
        alias("reward.reward_model.model_path", "reward_model.model.path"),
        *served_reward_model_rules("reward.reward_model.rollout"),
        mapped("{reward,reward_model}.sandbox_fusion.**", sandbox),
        mapped("sandbox_fusion.**", sandbox),
        alias("reward_manager.name", "reward_model.reward_manager"),
        refused("reward_manager.source", "reward managers are looked up by name; register your own in a module "
                "named in trainer.plugins", inert=only("register")),
        refused("reward_manager.module.**", "register your reward manager (rlkit.reward.REWARD_MANAGERS) in a module "
                "named in trainer.plugins", switch="path"),
        alias("reward_model.micro_batch_size", "reward_model.micro_batch_size_per_gpu"),
        *served_reward_model_rules("reward_model.rollout"),
        mapped("reward_model.launch_reward_fn_async", "nothing to set: rlkit scores on the driver's thread pool "
               "while nothing else waits on it"),
        mapped("reward_model.{use_dynamic_bsz,forward_max_token_len_per_gpu,ulysses_sequence_parallel_size,"
               "use_reward_loop,reward_loop_source,reward_loop_module_path,reward_loop_class_name}",
               "nothing to set: rlkit's reward model scores in micro-batches of reward_model.micro_batch_size_per_gpu "
               "rows, in the reward stage of the driver"),
        mapped("reward_model.model.{external_lib,use_shm,use_remove_padding,use_fused_kernels,override_config}",
               "nothing to set: the reward model loads plainly from reward_model.model.path"),
        mapped("reward_model.model.fsdp_config.{forward_prefetch,reshard_after_forward}", "nothing to set: "
               "the frozen reward model is one FSDP2 group wrapped per decoder layer"),
        mapped("reward_model.model.fsdp_config.wrap_policy.**", "nothing to set: the frozen reward model is one "
               "FSDP2 group wrapped per decoder layer"),
        mapped("reward_model.megatron.**", "nothing to set: the frozen reward model is one FSDP2 group wrapped per "
               "decoder layer, sharded over its workers (no Megatron splits)"),
        *profiler_rules("reward_model"),
        mapped(f"{ARR}.profiler.**", "nothing to set: verl's older layout profiles the whole actor/rollout/ref worker "
               "(nsys options); rlkit reads each role's own profiler (actor_rollout_ref.actor.profiler, ...)"),
    ]
    # --- algorithm
    rules += [
        alias("algorithm.rollout_correction.{rollout_is,rollout_is_threshold,rollout_rs,rollout_rs_threshold,"
              "bypass_mode}", "algorithm.{1}"),
        alias("algorithm.rollout_correction.loss_type", "algorithm.bypass_loss"),
        alias("algorithm.rollout_correction.rollout_is_batch_normalize", "algorithm.rollout_is_batch_normalize"),
        mapped("algorithm.filter_groups.metric", "nothing to set: dynamic sampling compares the samples' scores "
               "(for 0/1 rewards acc and score are the same)"),
        mapped("algorithm.filter_groups.max_inflight_gen_batches", "nothing to set: rlkit generates one refill "
               "batch at a time"),
    ]
    # --- distillation (the group exists in verl's PPO config)
    rules += [mapped("distillation.{_target_}", "nothing to set: verl's dataclass target"),
              mapped("distillation.distillation_loss._target_", "nothing to set: verl's dataclass target")]
    # --- trainer, Ray, profiler, verl's own switches
    rules += [
        refused("trainer.device", "Ascend NPUs are not supported by rlkit; use trainer.device=cuda, cpu or auto",
                inert=lambda v: False, when=lambda v: str(v).lower() == "npu"),
        mapped("trainer.profile_steps", "nothing to set: verl's older profiler step list; rlkit traces the steps of "
               "global_profiler.steps when global_profiler.tool is set"),
        alias("reward_model.param_offload", "reward_model.model.fsdp_config.param_offload",
              why="= reward_model.model.fsdp_config.param_offload (verl's older name)"),
        mapped("trainer.max_critic_ckpt_to_keep", "nothing to set: one checkpoint holds every role, kept as "
               "trainer.max_actor_ckpt_to_keep says"),
        mapped("trainer.default_hdfs_dir", "nothing to set: checkpoints are written to trainer.default_local_dir "
               "only; copy them to HDFS with your own tools"),
        mapped("trainer.del_local_ckpt_after_load", "nothing to set: rlkit keeps local checkpoints until rotation "
               "(trainer.max_actor_ckpt_to_keep)"),
        refused("trainer.val_only", "use `rlkit eval CKPT --data FILE` (the same rollout and scoring as "
                "validation)"),
        mapped("trainer.{esi_redundant_time,ray_wait_register_center_timeout,use_legacy_worker_impl,use_v1}",
               "nothing to set: verl's worker-implementation and elastic-training switches have no counterpart"),
        mapped("trainer.v1.**", "nothing to set: verl's v1 trainer modes; rlkit's modes are "
               "trainer.one_step_off_policy and trainer.fully_async"),
        mapped("transfer_queue.**", "nothing to set: batches travel through Ray's object store"),
        refused("skip.*.**", "skipping rollouts with dumped generations is not in rlkit", switch="enable"),
        mapped("global_profiler.tool", PROFILER_OFF, derive=profiler_tool, when=profiler_cannot_run),
        *global_profiler_rules(),
    ]
    return rules


VERL_KEYS: list[VerlKey] = _rules()
