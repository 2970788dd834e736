"""verl's SFT config keys that rlkit's SFT schema (sft_schema.py) does not hold under verl's name, one rule each.

The key space is verl's `sft_trainer_engine.yaml` with its defaults groups (model: hf_model, engine: fsdp, optim:
fsdp, profiler) and the older `fsdp_sft_trainer` layout (model.partial_pretrain, model.fsdp_config, data.multiturn,
top-level ulysses/remove-padding switches). The rules are read as rlkit.config.verl_rules says; first match wins.
"""

from __future__ import annotations

from rlkit.config.verl_compute_rules import (
    has_megatron_options,
    megatron_optimizer_name,
    megatron_optimizer_options,
    optimizer_name,
)
from rlkit.config.verl_role_keys import ANY, checkpoint_contents, dtype_name, model_rules, resume_path, strategy
from rlkit.config.verl_rules import VerlKey, alias, mapped, only, refused

PACKING = "nothing to set: rlkit packs (varlen) or right-pads as data.pad_mode says (no_padding | right)"


SFT_PROFILER = ("nothing to set: verl's profiler (nsys/npu/torch) does not run in rlkit's SFT trainer; the phase "
                "timings are in metrics.jsonl, and `rlkit debug stacks` shows where a worker is")


def _rules() -> list[VerlKey]:
    rules: list[VerlKey] = [
        mapped("{model,engine,optim,profiler,checkpoint}._target_", "nothing to set: verl's config class name"),
    ]
    # --- data
    rules += [
        mapped("data.{num_workers,use_shm}", "nothing to set: rlkit tokenizes every row once at start-up in the "
               "driver and reads the files from local disk"),
        mapped("data.balance_dp_token", "nothing to set: trainer.balance_batch balances tokens across workers"),
        mapped("data.ignore_input_ids_mismatch", "nothing to set: rlkit's mask never concatenates per-turn "
               "renderings: it renders the whole conversation once and finds each assistant turn in it (docs/sft.md), "
               "so there is no mismatch to ignore"),
        refused("data.custom_cls.{path,name}", "rlkit reads conversations (data.messages_key) or prompt/response "
                "columns; convert your data with `rlkit data messages FILE.jsonl`"),
        refused("data.chat_template", "rlkit uses the tokenizer's own chat template; edit tokenizer_config.json in "
                "the model folder"),
        mapped("data.multiturn.enable", "nothing to set: a file with the data.messages_key column is read as "
               "conversations, else as prompt_key/response_key columns"),
        alias("data.multiturn.{messages_key,tools_key,enable_thinking_key}", "data.{1}"),
        alias("data.micro_batch_size", "data.micro_batch_size_per_gpu",
              why="= data.micro_batch_size_per_gpu (verl's older name)"),
    ]
    # --- model (hf_model) and the older layout's model.* keys
    rules += [refused("model.external_lib", "rlkit's SFT trainer loads transformers' own model classes; remove it")]
    rules += model_rules("model")
    rules += [
        alias("model.partial_pretrain", "model.path"),
        alias("model.fsdp_config.{param_offload,optimizer_offload,fsdp_size}", "engine.{1}"),
        alias("model.fsdp_config.cpu_offload", "engine.param_offload"),
        alias("model.fsdp_config.offload_params", "engine.param_offload"),
        refused("model.fsdp_config.model_dtype", "rlkit keeps float32 master weights (engine.param_dtype is the "
                "compute dtype); remove it", inert=only("fp32", "float32")),
        mapped("model.fsdp_config.wrap_policy.**", "rlkit's FSDP2 wraps each decoder layer (and the root)"),
        mapped("model.strategy", "FSDP2", derive=strategy),
        mapped("model.lora_adapter_name", "nothing to set: rlkit's adapter has one name (the weights are the same)"),
        *[mapped(key, "rlkit's SFT trainer has no sequence parallelism (a memory layout: the loss is the same): each "
                 "worker holds whole conversations; if they do not fit, lower data.max_token_len_per_gpu or set "
                 "engine.param_offload=true")
          for key in ("ulysses_sequence_parallel_size", "engine.ulysses_sequence_parallel_size")],
        mapped("model.fused_kernel_options", "nothing to set: rlkit's fused LM head is pure torch"),
        mapped("use_remove_padding", PACKING),
    ]
    # --- engine (FSDP)
    rules += [
        refused("{engine,optim}", "rlkit's SFT trainer is FSDP2 (engine=fsdp, optim=fsdp: verl's config groups); "
                "Megatron is not in rlkit", inert=only("fsdp", "fsdp2")),
        alias("engine.dtype", "engine.param_dtype", dtype_name),
        mapped("engine.strategy", "FSDP2 (rlkit's training engine)", derive=strategy),
        mapped("engine.offload_policy", "nothing to set: no CPU offload asked", derive=lambda v, k: (
            {"engine.param_offload": True, "engine.optimizer_offload": True},
            "engine.param_offload=true and optimizer_offload=true") if v else ({}, "")),
        mapped("engine.wrap_policy.**", "rlkit's FSDP2 wraps each decoder layer (and the root); the wrap policy has "
               "nothing to choose"),
        mapped("engine.{forward_prefetch,use_orig_params,seed,forward_only,entropy_from_logits_with_chunking,"
               "entropy_checkpointing}", "nothing to set: FSDP2 keeps the original parameters and prefetches the "
               "next layer; SFT needs no entropy"),
        alias("engine.use_torch_compile", "model.use_torch_compile"),
        refused("engine.model_dtype", "rlkit keeps float32 master weights and optimizer state (engine.param_dtype "
                "is the compute dtype); remove it", inert=only("fp32", "float32")),
        mapped("engine.reshard_after_forward", "nothing to set: rlkit's FSDP2 units reshard after forward (less "
               "memory, one more all-gather; the same numbers)"),
        mapped("engine.full_determinism", "nothing to set: rlkit's SFT trainer does not switch on torch's "
               "deterministic algorithms (the same computation; float rounding may differ from run to run)"),
    ]
    # --- optim (fsdp)
    rules += [
        alias("optim.{warmup_style,lr_decay_style}", "optim.lr_scheduler_type"),
        alias("optim.warmup_steps_ratio", "optim.lr_warmup_steps_ratio"),
        mapped("optim.total_training_steps", "nothing to set: the schedule's length is trainer.total_training_steps "
               "(or the epochs' steps), filled in by the trainer as verl does"),
        mapped("optim.optimizer", "AdamW", derive=optimizer_name, when=megatron_optimizer_name),
        refused("optim.num_cycles", "rlkit's cosine schedule is one half-cycle; remove it", inert=only(0.5)),
        mapped("optim.override_optimizer_config", "Megatron options", derive=megatron_optimizer_options,
               when=has_megatron_options),
    ]
    # --- checkpoint, profiler, trainer
    rules += [
        refused("checkpoint.{save_contents,load_contents}", "rlkit's checkpoints always hold the model, the "
                "optimizer and the run state; for an HF folder use `rlkit export`", inert=checkpoint_contents),
        mapped("profiler.**", SFT_PROFILER),
        mapped("trainer.profile_interval", SFT_PROFILER),
        mapped("trainer.resume_from_path", "nothing to set: no path given", derive=resume_path),
        mapped("trainer.default_hdfs_dir", "nothing to set: checkpoints are written to trainer.default_local_dir "
               "only; copy them to HDFS with your own tools"),
        refused("trainer.checkpoint.**", "rlkit's checkpoints always hold the model, the optimizer and the run "
                "state", inert=ANY),
    ]
    return rules


#: every verl SFT key that is not in sft_schema.py, as a rule (docs/sft.md lists them)
VERL_SFT_KEYS: list[VerlKey] = _rules()
