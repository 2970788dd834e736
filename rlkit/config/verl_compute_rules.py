"""Value conversions of the verl keys that change what is computed and that rlkit implements under verl's name
(optimizer, LoRA, precision, engine names...): the `derive`/`when` functions the rules of verl_keys.py and
verl_role_keys.py use for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlkit.config.verl_rules import VerlKey, alias, mapped, refused

#: Megatron's optimizer options that only move optimizer state to host memory (verl passes them in
#: `override_optimizer_config` to megatron.core's OptimizerConfig); torch optimizers take none of them
MEGATRON_OFFLOAD_OPTIONS = frozenset({"optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d",
                                      "use_precision_aware_optimizer", "optimizer_cpu_offload",
                                      "use_torch_optimizer_for_cpu_offload", "pin_cpu_grads", "pin_cpu_params",
                                      "store_param_remainders"})


def megatron_optimizer_name(value: Any) -> bool:
    """`optim.optimizer` spelled as Megatron does (adam: its Adam decouples weight decay, i.e. torch's AdamW)."""
    return isinstance(value, str) and value in ("adam", "adamw")


def optimizer_name(value: Any, key: str) -> tuple[dict, str]:
    return {key: "AdamW"}, f"{key}=AdamW (Megatron's {value} decouples weight decay, as torch.optim.AdamW does)"


def has_megatron_options(value: Any) -> bool:
    return isinstance(value, dict) and bool(MEGATRON_OFFLOAD_OPTIONS & set(value))


def _offload_target(key: str) -> str:
    role = key.split(".optim.")[0]
    return f"{role}.fsdp_config.optimizer_offload"


def megatron_optimizer_options(value: Any, key: str) -> tuple[dict, str]:
    """The whole `override_optimizer_config` mapping: Megatron's offload options out, the rest kept for the class."""
    rest = {k: v for k, v in value.items() if k not in MEGATRON_OFFLOAD_OPTIONS}
    out: dict[str, Any] = {key: rest}
    names = sorted(MEGATRON_OFFLOAD_OPTIONS & set(value))
    if value.get("optimizer_cpu_offload"):
        out[_offload_target(key)] = True
        return out, (f"Megatron's {', '.join(names)} -> {_offload_target(key)}=true (FSDP2 keeps the optimizer "
                     "state in host memory); the other keys go to the optimizer class")
    return out, f"Megatron's {', '.join(names)}: nothing to set (optimizer offload tuning); the rest goes to the class"


def megatron_optimizer_option(value: Any, key: str) -> tuple[dict, str]:
    """One `override_optimizer_config.<megatron option>=value` from the command line."""
    if key.endswith(".optimizer_cpu_offload") and value and str(value).lower() != "false":
        target = _offload_target(key)
        return {target: True}, f"{target}=true (FSDP2 keeps the optimizer state in host memory)"
    return {}, "nothing to set: a Megatron optimizer-offload tuning option (torch optimizers take none)"



#: verl's engine names that are FSDP under another launcher or kernel set (`model_engine=`, `*.strategy=`): what
#: rlkit's FSDP2 does in their place ('' = nothing to say beyond the rule's line)
FSDP_VARIANTS = {
    "fsdp2": "",
    "fsdp": "FSDP2 (rlkit's training engine: the same full sharding as verl's FSDP1, per decoder layer)",
    "dp": "FSDP2 (verl's data-parallel engine group is FSDP; rlkit's is FSDP2, per decoder layer)",
    "veomni": "FSDP2 (VeOmni shards with FSDP2 too; its fused kernels are replaced by transformers' modules, "
              "veomni.* map as their own lines say)",
    "fsdp_turbo": "FSDP2 (verl's turbo FSDP engine: the same sharding, its speed-ups not applied)",
    "torchtitan": "FSDP2 (torchtitan's data parallelism is FSDP2; rlkit runs the HF model instead of its own)",
}

VEOMNI_KERNELS = ("a VeOmni kernel choice: rlkit runs transformers' own modules (attention: "
                  "actor_rollout_ref.model.attn_implementation)")


Derive = Callable[[Any, str], tuple[dict, str]]


def veomni_rules(prefix: str, role: str, strategy: Derive, replay: Derive) -> list[VerlKey]:
    """verl's VeOmni engine section of one role (`prefix`: actor.veomni, ...) on rlkit's FSDP2 (`strategy` and
    `replay` read the engine name and the routing-replay mode as the other engines' sections do)."""
    target = f"{role}.fsdp_config"
    return [
        alias(f"{prefix}.{{param_offload,optimizer_offload,fsdp_size}}", f"{target}.{{1}}"),
        alias(f"{prefix}.enable_fsdp_offload", f"{target}.param_offload"),
        alias(f"{prefix}.ulysses_parallel_size", f"{role}.ulysses_sequence_parallel_size"),
        mapped(f"{prefix}.strategy", "FSDP2", derive=strategy),
        alias(f"{prefix}.expert_parallel_size", f"{target}.expert_parallel_size"),
        mapped(f"{prefix}.*_implementation", VEOMNI_KERNELS),
        mapped(f"{prefix}.{{mixed_precision,seed,full_determinism,init_device,enable_full_shard,ckpt_manager,"
               "forward_prefetch,use_torch_compile,entropy_from_logits_with_chunking,entropy_checkpointing,"
               "forward_only,enable_reentrant,force_use_huggingface,activation_gpu_limit,basic_modules,"
               "pad_to_length,pad_to_length_bucket}",
               "nothing to set: a VeOmni engine setting of speed or memory; rlkit's FSDP2 wraps each decoder layer "
               "in the role's fsdp_config dtype, seeds from trainer.seed and reads the role's own keys"),
        mapped(f"{prefix}.router_replay.mode", "nothing to set: routing replay off", derive=replay),
        refused(f"{prefix}.load_checkpoint_path", "rlkit starts from model.path (or resumes with "
                "trainer.resume_mode); point model.path at the weights instead"),
    ]


SERVED_RM = ("the reward model scores in rlkit's own worker instead of an engine server: verl's reward loop reads a "
             "served model as a discriminative RM (its score head), which is rlkit's reward_model.style=classifier "
             "(the default); a generative judge is reward_model.style=judge with judge.backend=vllm (docs/rewards.md)")


def served_reward_model_rules(prefix: str) -> list[VerlKey]:
    """verl's reward model served by an engine (`reward_model.rollout.*`, newer `reward.reward_model.rollout.*`):
    the same scores from rlkit's reward-model role; the engine's sizes have nothing to size."""
    return [
        mapped(f"{prefix}.name", SERVED_RM),
        mapped(f"{prefix}.**", "nothing to set: the serving engine's sizes and lengths (rlkit's reward-model role "
               "reads reward_model.micro_batch_size_per_gpu and max_length; the judge, reward_model.judge.*)"),
    ]


def has_hf_model(value: Any) -> bool:
    """verl's checkpoint contents naming `hf_model` (an HF copy of the weights in each checkpoint)."""
    return isinstance(value, list | tuple) and "hf_model" in map(str, value)


def without_hf_model(value: Any, key: str) -> tuple[dict, str]:
    """hf_model: the weights, saved in rlkit's format (so `model` stays in); the HF folder is `rlkit export`."""
    rest = [v for v in value if str(v) != "hf_model"]
    rest = rest if "model" in map(str, rest) else ["model", *rest]
    return {key: rest}, (f"{key}={rest}: hf_model is `rlkit export CKPT` (an HF folder from any checkpoint, "
                         "written when asked instead of at every save)")
