"""The verl keys every role section repeats (FSDP engine, Megatron engine, optimizer, model, checkpoint/profiler),
as rule builders per section, and the value conversions the rules share; the table itself is verl_keys.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlkit.config.verl_compute_rules import (
    FSDP_VARIANTS,
    MEGATRON_OFFLOAD_OPTIONS,
    has_hf_model,
    has_megatron_options,
    megatron_optimizer_name,
    megatron_optimizer_option,
    megatron_optimizer_options,
    optimizer_name,
    without_hf_model,
)
from rlkit.config.verl_rules import VerlKey, alias, falsy, mapped, only, refused
from rlkit.errors import UserError

ARR = "actor_rollout_ref"
ACTOR, REF, ROLLOUT, MODEL = f"{ARR}.actor", f"{ARR}.ref", f"{ARR}.rollout", f"{ARR}.model"
ANY: Any = lambda value: True  # noqa: E731 - an `inert` test: every value (a parameter of a refused switch)

# verl spells dtypes short; rlkit spells them as torch does
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "bfloat16": "bfloat16",
               "float16": "float16", "float32": "float32"}


def dtype_name(value: Any) -> str:
    name = DTYPE_NAMES.get(str(value).lower())
    if name is None:
        raise UserError(f"dtype '{value}' is not one of {sorted(DTYPE_NAMES)}")
    return name


REPLAY_OFF = "nothing to set: routing replay off"
FSDP2 = "FSDP2 (rlkit's training engine for every role)"


def strategy(value: Any, key: str) -> tuple[dict, str]:
    """`*.strategy`: rlkit trains every role with FSDP2; Megatron's parallel sizes are mapped key by key."""
    name = str(value).lower()
    if name in FSDP_VARIANTS:
        return {}, FSDP_VARIANTS[name]
    if name == "megatron":
        return {}, ("FSDP2: rlkit trains with FSDP2; megatron.* sizes map as their own lines say "
                    "(tensor parallel -> fsdp_config.tensor_parallel_size, context parallel -> Ulysses SP; "
                    "expert parallel -> FSDP2 sharding; pipeline parallel only at 1)")
    raise UserError(f"config key '{key}={value}' is not supported by rlkit: rlkit trains with FSDP2 "
                    f"({', '.join(sorted(FSDP_VARIANTS))} and megatron are accepted and run as FSDP2)")


OTHER_ENGINES = ("sglang", "trtllm")
OTHER_ENGINE = ("nothing to set: these arguments configure an engine rlkit does not run (rlkit generates with vLLM, "
                "whose arguments go under rollout.engine_kwargs.vllm)")


def names_other_engine(value: Any) -> bool:
    """An `engine_kwargs` mapping with arguments for SGLang or TensorRT-LLM."""
    return isinstance(value, dict) and any(value.get(name) for name in OTHER_ENGINES)


def drop_other_engines(value: Any, key: str) -> tuple[dict, str]:
    """`rollout.engine_kwargs` as a whole: the vLLM arguments kept, SGLang's and TensorRT-LLM's dropped with a line."""
    kept = {name: ({} if name in OTHER_ENGINES else args) for name, args in value.items()}
    dropped = " and ".join(f"{name}" for name in OTHER_ENGINES if value.get(name))
    return {key: kept}, f"the {dropped} arguments dropped: {OTHER_ENGINE.removeprefix('nothing to set: ')}"


PROFILER_OFF = "no profiler runs"


def profiler_tool(value: Any, key: str) -> tuple[dict, str]:
    """`global_profiler.tool` naming a profiler rlkit does not run (nsys, npu, ...), or CUDA memory snapshots on a
    machine without CUDA: profiling off, with why."""
    from rlkit.config.profiler import REFUSED_TOOLS

    why = REFUSED_TOOLS.get(str(value).lower(), "CUDA memory snapshots need a GPU and this machine has none")
    return {key: None}, f"{key}=null, {PROFILER_OFF}: {why}"


def profiler_cannot_run(value: Any) -> bool:
    """A `global_profiler.tool` value rlkit does not run here (the `when` of the rule that turns it off)."""
    from rlkit.config.profiler import REFUSED_TOOLS

    name = str(value).lower()
    if name == "torch_memory":
        import torch

        return not torch.cuda.is_available()
    return name in REFUSED_TOOLS


def rollout_engine(value: Any, key: str) -> tuple[dict, str]:
    """`rollout.name`: SGLang / TensorRT-LLM scripts run on the vLLM engine with the same sampling settings."""
    return {key: "vllm"}, f"{key}=vllm (rlkit's engines are vllm and hf; the sampling settings are kept)"


def recompute(target: str) -> Any:
    def derive(value: Any, key: str) -> tuple[dict, str]:
        on = str(value).lower() in ("full", "selective")
        return ({target: True}, f"{target}=true (activation recomputation per decoder layer)") if on else ({}, "")
    return derive


def offload_policy(prefix: str) -> Any:
    def derive(value: Any, key: str) -> tuple[dict, str]:
        if not value:
            return {}, ""
        return ({f"{prefix}.param_offload": True, f"{prefix}.optimizer_offload": True},
                f"{prefix}.param_offload=true and optimizer_offload=true (FSDP2 CPU offload; a no-op on CPU)")
    return derive


DETERMINISM_OFF = "nothing to set: trainer.deterministic (one switch for the whole run) stays as set"


def full_determinism(value: Any, key: str) -> tuple[dict, str]:
    """verl's per-role `full_determinism`: rlkit's one run-wide switch, `trainer.deterministic`."""
    if falsy(value):
        return {}, DETERMINISM_OFF
    return {"trainer.deterministic": True}, "trainer.deterministic=true (every worker: torch's deterministic " \
        "algorithms, vLLM's batch-invariant mode)"


def router_replay(target: str) -> Any:
    """verl's routing-replay modes: R2 replays the routes of the trainer's own old-log-prob pass in the update, R3
    the rollout engine's (`{target}_from`)."""
    modes = {"R2": ("old_log_prob", "the experts of the actor's old-log-prob pass, replayed in the update"),
             "R3": ("rollout", "the experts the rollout engine chose, replayed in training")}

    def derive(value: Any, key: str) -> tuple[dict, str]:
        mode = str(value).upper()
        if mode in ("DISABLED", "NONE"):
            return {}, ""
        if mode not in modes:
            raise UserError(f"config key '{key}={value}': verl's routing-replay modes are disabled, R2 and R3")
        source, what = modes[mode]
        return {target: True, f"{target}_from": source}, f"{target}=true, {target}_from={source} ({what})"
    return derive


def checkpoint_contents(value: Any) -> bool:
    """rlkit's checkpoints always hold the model, the optimizer and the run state (verl's model/optimizer/extra)."""
    return value is None or (isinstance(value, str) and value.startswith("${")) or (
        isinstance(value, list | tuple) and set(map(str, value)) <= {"model", "optimizer", "extra"})


def resume_path(value: Any, key: str) -> tuple[dict, str]:
    """verl's resume_from_path: rlkit's resume_mode takes the path; a folder that does not exist yet (a script's
    first run) starts fresh, as verl does."""
    if value in (None, ""):
        return {}, ""
    if not Path(os.path.expanduser(str(value))).exists():
        return {"trainer.resume_mode": "disable"}, (f"{value} does not exist yet: the run starts fresh "
                                                    "(trainer.resume_mode=disable), as verl does")
    return {"trainer.resume_mode": value}, f"trainer.resume_mode={value} (rlkit's resume_mode takes the path itself)"


MODEL_DTYPE = ("nothing to set: rlkit keeps float32 master weights and optimizer state (a 16-bit model_dtype saves "
               "memory; the updates lose less to rounding in float32); the compute dtype is fsdp_config.param_dtype "
               "(auto: bf16 on GPU, as verl's mixed precision)")


def fsdp_rules(prefix: str, role: str) -> list[VerlKey]:
    """verl's FSDP engine keys of one role's fsdp section (`prefix`: actor.fsdp_config, critic.fsdp, ...)."""
    target = f"{role}.fsdp_config"
    sp = f"{role}.ulysses_sequence_parallel_size"
    return [
        alias(f"{prefix}.{{param_offload,optimizer_offload}}", f"{target}.{{1}}"),
        alias(f"{prefix}.dtype", f"{target}.param_dtype", dtype_name),
        alias(f"{prefix}.ulysses_sequence_parallel_size", sp),
        alias(f"{prefix}.fsdp_size", f"{target}.fsdp_size"),
        mapped(f"{prefix}.offload_policy", "nothing to set: no CPU offload asked", derive=offload_policy(target)),
        mapped(f"{prefix}.wrap_policy.**", "rlkit's FSDP2 wraps each decoder layer (and the root); the wrap policy "
               "has nothing to choose"),
        mapped(f"{prefix}.{{forward_prefetch,use_orig_params,seed,forward_only,pad_to_length_bucket}}",
               "nothing to set: FSDP2 keeps the original parameters, prefetches the next layer, seeds from "
               "trainer.seed, and the frozen reference is forward-only by role"),
        mapped(f"{prefix}.{{entropy_from_logits_with_chunking,entropy_from_logits_chunk_size,entropy_checkpointing,"
               "use_torch_compile}", "read from the role's own keys (logits_chunk_size, model.fused_lm_head, "
               "model.use_torch_compile), which rlkit's FSDP section does not repeat"),
        mapped(f"{prefix}.strategy", FSDP2, derive=strategy),
        mapped(f"{prefix}.turbo_config.**", "verl's turbo engine settings: rlkit's engine is FSDP2, sharded over "
               "every data-parallel worker"),
        mapped(f"{prefix}.model_dtype", MODEL_DTYPE),
        alias(f"{prefix}.mixed_precision.{{param_dtype,reduce_dtype}}", f"{target}.{{1}}", dtype_name),
        mapped(f"{prefix}.mixed_precision.buffer_dtype", "nothing to set: buffers (rotary frequencies, norms' "
               "statistics) stay in the dtype the model loads them in, float32 masters (verl's default fp32)"),
        mapped(f"{prefix}.reshard_after_forward", "nothing to set: rlkit's FSDP2 units reshard after forward "
               "(less memory, one more all-gather; the same numbers)"),
        mapped(f"{prefix}.full_determinism", DETERMINISM_OFF, derive=full_determinism),
        mapped(f"{prefix}.pad_to_length", PAD_NOTICE),
        refused(f"{prefix}.qat.**", "quantisation-aware training is not in rlkit; remove qat.*", switch="enable"),
    ]


def megatron_rules(prefix: str, role: str, model_prefix: str) -> list[VerlKey]:
    """verl's Megatron engine keys of one role (`prefix`: actor.megatron, ...) on rlkit's FSDP2."""
    return [
        alias(f"{prefix}.tensor_model_parallel_size", f"{role}.fsdp_config.tensor_parallel_size",
              why=f"= {role}.fsdp_config.tensor_parallel_size (DTensor tensor parallel: groups of that many "
                  "workers split the projections, embedding and LM head; FSDP2 shards over the rest)"),
        refused(f"{prefix}.{{pipeline_model_parallel_size,virtual_pipeline_model_parallel_size}}",
                "pipeline parallel is not in rlkit: its FSDP2 workers each run every layer (the RL step's many short "
                "forwards of different lengths would leave a pipeline mostly idle); for memory use "
                "tensor_model_parallel_size and FSDP2 sharding, and set pipeline_model_parallel_size=1",
                inert=only(1)),
        alias(f"{prefix}.expert_model_parallel_size", f"{role}.fsdp_config.expert_parallel_size",
              why=f"= {role}.fsdp_config.expert_parallel_size (DTensor expert parallel: groups of that many "
                  "data-parallel workers split the experts, tokens dispatched by all-to-all)"),
        mapped(f"{prefix}.expert_tensor_parallel_size", "rlkit keeps each expert whole on its expert-parallel "
               "worker (a speed/memory setting: the same numbers)"),
        alias(f"{prefix}.context_parallel_size", f"{role}.ulysses_sequence_parallel_size",
              why=f"= {role}.ulysses_sequence_parallel_size (sequence parallelism over the same number of workers)"),
        alias(f"{prefix}.{{param_offload,optimizer_offload}}", f"{role}.fsdp_config.{{1}}"),
        alias(f"{prefix}.dtype", f"{role}.fsdp_config.param_dtype", dtype_name),
        mapped(f"{prefix}.override_transformer_config.recompute_granularity", "nothing to set: no recomputation asked",
               derive=recompute(f"{model_prefix}.enable_gradient_checkpointing")),
        mapped(f"{prefix}.{{override_transformer_config}}", "Megatron transformer overrides: the HF model runs as "
               "its config says (attention: actor_rollout_ref.model.attn_implementation)"),
        mapped(f"{prefix}.override_transformer_config.**", "Megatron transformer overrides: the HF model runs as "
               "its config says (attention: actor_rollout_ref.model.attn_implementation)"),
        mapped(f"{prefix}.{{grad_offload,seed,use_mbridge,vanilla_mbridge,use_dist_checkpointing,"
               "dist_checkpointing_path,dist_checkpointing_prefix,dist_ckpt_optim_fully_reshardable,"
               "distrib_optim_fully_reshardable_mem_efficient,use_distributed_optimizer,use_megatron_fsdp,"
               "pad_bshd_to_minibatch_max,max_seqlen_per_dp_cp_rank,dynamic_context_parallel,"
               "forward_only,override_ddp_config,override_mcore_model_config,pad_to_length,pad_to_length_bucket,"
               "use_remove_padding,entropy_from_logits_with_chunking,entropy_from_logits_chunk_size}",
               "a Megatron engine setting with no counterpart in FSDP2: rlkit loads and saves HF weights directly, "
               "shards optimizer state with the parameters and packs sequences as model.use_remove_padding says"),
        alias(f"{prefix}.sequence_parallel", f"{role}.fsdp_config.sequence_parallel",
              why=f"= {role}.fsdp_config.sequence_parallel (under tensor parallel the norms and the residual stream "
                  "run on sequence slices; the same numbers, less activation memory)"),
        refused(f"{prefix}.qat.**", "quantisation-aware training is not in rlkit; remove qat.*", switch="enable"),
        mapped(f"{prefix}.router_replay.mode", REPLAY_OFF, derive=router_replay(f"{ACTOR}.router_replay")),
        refused(f"{prefix}.router_replay.{{record_file,replay_file}}", "rlkit replays routes in memory from the "
                "rollout of the same step; there are no route files"),
    ]


def optim_rules(prefix: str, role: str) -> list[VerlKey]:
    """verl's optimizer keys of one role beyond rlkit's (lr, betas, weight_decay, warmup, scheduler)."""
    return [
        alias(f"{prefix}.clip_grad", f"{role}.grad_clip"),
        alias(f"{prefix}.lr_min", f"{prefix}.min_lr"),
        alias(f"{prefix}.{{warmup_style,lr_decay_style}}", f"{prefix}.lr_scheduler_type"),
        mapped(f"{prefix}.total_training_steps", "nothing to set: the schedule's length is "
               "trainer.total_training_steps (or the epochs' steps), filled in by the trainer as verl does"),
        mapped(f"{prefix}.optimizer", "AdamW", derive=optimizer_name, when=megatron_optimizer_name),
        mapped(f"{prefix}.override_optimizer_config", "Megatron options", derive=megatron_optimizer_options,
               when=has_megatron_options),
        mapped(f"{prefix}.override_optimizer_config.{{{','.join(sorted(MEGATRON_OFFLOAD_OPTIONS))}}}",
               "Megatron options", derive=megatron_optimizer_option, when=ANY),
        refused(f"{prefix}.num_cycles", "rlkit's cosine schedule is one half-cycle; remove it", inert=only(0.5)),
        refused(f"{prefix}.zero_indexed_step", "rlkit's schedules count steps from 0; remove it", inert=only(True)),
        mapped(f"{prefix}.{{exp_avg_dtype,exp_avg_sq_dtype,main_grads_dtype}}", "nothing to set: rlkit keeps "
               "optimizer state and gradients in float32 (more memory than a lower precision, no less exact)"),
        refused(f"{prefix}.weight_decay_incr_style", "rlkit's weight decay is constant", inert=only("constant")),
        refused(f"{prefix}.lr_warmup_init", "rlkit's warmup starts from lr / warmup steps (lr_warmup_steps); "
                "remove it"),
        refused(f"{prefix}.{{lr_decay_steps,lr_wsd_decay_steps}}", "the decay runs over the whole run "
                "(lr_scheduler_type, min_lr_ratio); remove it"),
        refused(f"{prefix}.lr_wsd_decay_style", "rlkit has no warmup-stable-decay schedule; remove it",
                inert=only("exponential")),
        mapped(f"{prefix}.{{use_checkpoint_opt_param_scheduler,"
               "use_layer_wise_distributed_optimizer,use_precision_aware_optimizer}",
               "nothing to set: a Megatron optimizer's memory layout; rlkit's AdamW state is sharded with the FSDP2 "
               "parameters, in float32, and a resumed run restores its schedule from the checkpoint"),
        refused(f"{prefix}.muon_*", "read only by the Muon optimizer, which rlkit does not have", inert=ANY),
    ]


def model_rules(prefix: str) -> list[VerlKey]:
    """verl's model keys beyond rlkit's (path, LoRA, remove-padding, gradient checkpointing, trust_remote_code)."""
    return [
        mapped(f"{prefix}.external_lib", "nothing to set: no library named",
               derive=lambda v, k: ({"trainer.plugins": [v]} if v else {},
               f"trainer.plugins=[{v}] (imported by the driver and every worker first)" if v else "")),
        mapped(f"{prefix}.use_shm", "nothing to set: the model is read from local disk (rlkit never downloads at "
               "run time)"),
        mapped(f"{prefix}.fused_kernel_options.**", "nothing to set: rlkit's fused LM head is pure torch"),
        mapped(f"{prefix}.torch_dtype", "nothing to set: verl's model config reads no torch_dtype (the weights' "
               "dtype is fsdp_config.model_dtype); rlkit loads float32 masters and computes in "
               "fsdp_config.param_dtype"),
        mapped(f"{prefix}.use_liger", "nothing to set: Liger's fused kernels are not loaded; the same layers run as "
               "transformers' own (model.use_fused_kernels is rlkit's fused log-prob head)"),
        refused(f"{prefix}.{{tokenizer_path,hf_config_path}}", "rlkit reads the tokenizer and config from "
                "model.path; put them in that folder"),
        *([] if prefix == MODEL else [  # the policy's two are rlkit keys (schema.ModelConfig)
            refused(f"{prefix}.custom_chat_template", "the critic scores the policy's token ids; its template is "
                    "actor_rollout_ref.model.custom_chat_template"),
            refused(f"{prefix}.override_config", "the critic loads with its folder's config.json; edit it there "
                    "(the policy's: actor_rollout_ref.model.override_config)")]),
        mapped(f"{prefix}.{{enable_activation_offload,enable_activation_offloading}}", "nothing to set: activations "
               "stay on the device "
               "(model.enable_gradient_checkpointing is rlkit's way to save activation memory)"),
        mapped(f"{prefix}.tiled_mlp.**", "nothing to set: the MLP runs untiled (the same numbers, more peak "
               "memory on long sequences)"),
        refused(f"{prefix}.mtp.enable_train", "training the multi-token-prediction layers adds their loss "
                "(mtp_loss_scaling_factor) to the objective, which rlkit does not compute; set enable_train=false "
                "(mtp.enable and mtp.enable_rollout alone are accepted)"),
        mapped(f"{prefix}.mtp.**", "nothing to set: without enable_train, multi-token prediction only keeps the MTP "
               "weights in checkpoints (enable) or drafts tokens for speculative decoding (enable_rollout); rlkit "
               "trains the HF model's next-token objective and decodes without drafts, the same distribution"),
        refused(f"{prefix}.lora.**", "this is Megatron's LoRA section: use model.lora_rank / lora_alpha / "
                "target_modules (rlkit's PEFT LoRA)", switch="rank"),
    ]


def role_common(prefix: str, role: str) -> list[VerlKey]:
    """Keys every trained or frozen role of verl carries (checkpoint contents, profiler, internal interpolations)."""
    return [
        mapped(f"{prefix}.checkpoint.{{save_contents,load_contents}}", "hf_model", derive=without_hf_model,
               when=has_hf_model),
        refused(f"{prefix}.checkpoint.{{save_contents,load_contents}}", "a frozen role's weights are the model "
                "folder's; rlkit saves no checkpoint for it", inert=checkpoint_contents),
        mapped(f"{prefix}.checkpoint.async_save", "nothing to set: rlkit saves checkpoints synchronously "
               "(atomic, verified)"),
        mapped(f"{prefix}.checkpoint.strict", "nothing to set: verl checks the HF weights its Megatron bridge "
               "exports with it; rlkit loads and exports with transformers, which checks every tensor's name and "
               "shape"),
        mapped(f"{prefix}.checkpoint.mbridge_config", "nothing to set: rlkit's checkpoints hold HF-format weights "
               "directly (no Megatron bridge)"),
        *profiler_rules(prefix),
        mapped(f"{prefix}.{{rollout_n,nccl_timeout,data_loader_seed,shuffle}}", "nothing to set: rollout.n, "
               "trainer.seed and actor.shuffle already say it, and torch.distributed's default timeout applies"),
        refused(f"{prefix}.loss_scale_factor", "rlkit normalises losses by loss_agg_mode alone; remove it"),
        refused(f"{prefix}.router_replay.{{record_file,replay_file}}", "rlkit replays routes in memory from the "
                "rollout of the same step; there are no route files"),
        mapped(f"{prefix}.pad_to_length", PAD_NOTICE),
    ]


PAD_NOTICE = ("nothing to set: rlkit packs sequences (model.use_remove_padding) or trims padding instead of padding "
              "to a fixed length (the same numbers)")
PROFILER_HOOKS = ("nothing to set: traces are not copied and no command runs after profiling; the traces are files "
                  "under global_profiler.save_path")


PRECISION_DEBUGGER = ("nothing to set: verl's precision debugger (Ascend's msprobe) does not run; for non-finite "
                      "values use `rlkit train --debug nan`")


def profiler_rules(prefix: str) -> list[VerlKey]:
    """A role's `profiler` keys rlkit's schema does not hold (rlkit/config/profiler.py: enable, ranks, contents)."""
    p = f"{prefix}.profiler"
    return [
        mapped(f"{p}.discrete", "nothing to set: rlkit writes one trace per worker call (as verl's discrete=true)"),
        mapped(f"{p}.{{tool,save_path}}", "nothing to set: rlkit has one profiler per run, global_profiler.tool and "
               "global_profiler.save_path"),
        mapped(f"{p}.tool_config", "nothing to set: verl's older layout copies the actor's tool options here; rlkit "
               "reads each role's own"),
        mapped(f"{p}.tool_config.torch.discrete", "nothing to set: rlkit writes one trace per worker call (as verl's "
               "discrete=true)"),
        mapped(f"{p}.tool_config.torch.schedule.**", "nothing to set: rlkit traces each step of "
               "global_profiler.steps whole (list the steps there) instead of following a schedule"),
        mapped(f"{p}.tool_config.torch.{{profile_token_start,profile_token_end}}", "nothing to set: rlkit traces a "
               "rollout call whole, not a token range"),
        mapped(f"{p}.tool_config.torch_memory.**", "nothing to set: rlkit reads "
               "global_profiler.global_tool_config.torch_memory"),
        mapped(f"{p}.tool_config.{{nsys,npu}}.**", "nothing to set: read only by the nsys/npu tools, which rlkit "
               "refuses"),
        mapped(f"{p}.tool_config.precision_debugger.**", PRECISION_DEBUGGER),
        mapped(f"{p}.{{relocate_results,finish_hook_cmd,finish_hook_all_ranks,finish_hook_ranks}}", PROFILER_HOOKS),
    ]


def global_profiler_rules() -> list[VerlKey]:
    """`global_profiler` keys rlkit's schema does not hold (it holds tool, steps, save_path, torch_memory's options)."""
    g = "global_profiler"
    return [
        mapped(f"{g}.profile_continuous_steps", "nothing to set: rlkit writes one trace per worker call of each step "
               "in global_profiler.steps"),
        mapped(f"{g}.{{relocate_results,finish_hook_cmd,finish_hook_all_ranks,finish_hook_ranks}}", PROFILER_HOOKS),
        mapped(f"{g}.global_tool_config.nsys.**", "nothing to set: read only by global_profiler.tool=nsys, which "
               "rlkit refuses (torch traces show CUDA kernels too)"),
        mapped(f"{g}.global_tool_config.torch_memory.stack_depth", "nothing to set: torch records whole stacks "
               "(global_profiler.global_tool_config.torch_memory.stacks: python | all)"),
        mapped(f"{g}.global_tool_config.torch_memory.kw_args", "nothing to set: rlkit passes context, stacks and "
               "trace_alloc_max_entries to torch.cuda.memory._record_memory_history"),
        mapped(f"{g}.global_tool_config.precision_debugger.**", PRECISION_DEBUGGER),
    ]
