"""Value conversions of the verl keys that change what is computed and that rlkit implements under verl's name
(optimizer, LoRA, precision, engine names...): the `derive`/`when` functions the rules of verl_keys.py and
verl_role_keys.py use for them."""

from __future__ import annotations

from typing import Any

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

