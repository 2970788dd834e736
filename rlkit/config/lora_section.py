"""verl's newer LoRA section, `actor_rollout_ref.model.lora.*` (written for its Megatron engine: rank, alpha, Megatron
module names), read onto rlkit's one set of LoRA keys (`model.lora_rank`, `lora_alpha`, `target_modules`,
`exclude_modules`, `lora_adapter_path`) beside verl's older FSDP spelling of the same keys.

`settle_lora_section` (finalize) moves the section's values onto those keys; a value the older keys already set
differently is one error line. The section's settings of speed or initialisation are dropped by the verl-key rules
(`lora_rules`) with one line each, before the schema sees them.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.verl_rules import VerlKey, mapped, refused
from rlkit.errors import UserError

#: Megatron's fused module names -> the HF projections they hold (what PEFT targets in the HF model)
MEGATRON_MODULES = {
    "linear_qkv": ["q_proj", "k_proj", "v_proj"],
    "linear_proj": ["o_proj"],
    "linear_fc1": ["gate_proj", "up_proj"],
    "linear_fc2": ["down_proj"],
}
#: the section's keys that move onto rlkit's LoRA keys -> (the rlkit key, its value when the older keys leave it unset)
SECTION_KEYS = {"rank": ("lora_rank", 0), "alpha": ("lora_alpha", 16),
                "target_modules": ("target_modules", "all-linear"), "exclude_modules": ("exclude_modules", None),
                "adapter_path": ("lora_adapter_path", None)}
#: verl's section's own default alpha (its older key's default is rlkit's, 16)
SECTION_ALPHA = 32
#: the section's keys that tune speed or initialisation, mapped with a line by `lora_rules`
TUNING = {
    "merge": "nothing to set: rlkit merges the adapter into the engine's weights at each sync unless "
             "rollout.lora_sync=native (the same weights either way)",
    "a2a_experimental": "nothing to set: a Megatron communication option",
    "dtype": "nothing to set: the adapter trains in float32 master weights like every trained parameter",
    "dropout_position": "nothing to set: rlkit's adapters have no dropout",
    "lora_A_init_method": "nothing to set: PEFT's initialisation (A kaiming-uniform, B zero: the adapter starts as "
                          "a no-op, as verl's does)",
    "lora_B_init_method": "nothing to set: B starts at zero (PEFT), so the adapter starts as a no-op",
    "freeze_vision_model": "nothing to set: the adapter goes on target_modules; the vision tower trains or not as "
                           "actor.freeze_vision_tower says",
    "type": "nothing to set: PEFT LoRA on the HF projections (one adapter per q/k/v projection, as canonical_lora)",
}


def lora_rules(prefix: str) -> list[VerlKey]:
    """The section's tuning keys, given one by one (command line) or as a whole mapping (YAML), mapped with a line;
    a value rlkit cannot compute (dropout, DoRA) refused."""
    return [
        mapped(f"{prefix}.lora", "LoRA section", derive=_strip_tuning, when=_has_tuning),
        refused(f"{prefix}.lora.type", "rlkit's adapters are PEFT LoRA; use type=lora",
                inert=lambda v: v is None or str(v).lower() in ("lora", "canonical_lora"),
                when=lambda v: True),
        refused(f"{prefix}.lora.dropout", "rlkit's adapters have no dropout (log-probs must be deterministic for the "
                "PPO ratio); set it to 0", when=lambda v: True),
        *[mapped(f"{prefix}.lora.{key}", why, when=lambda v: True) for key, why in TUNING.items() if key != "type"],
    ]


def _has_tuning(value: Any) -> bool:
    return isinstance(value, dict) and bool(set(value) & (set(TUNING) | {"dropout"}))


def _strip_tuning(value: Any, key: str) -> tuple[dict, str]:
    if str(value.get("type", "lora")).lower() not in ("lora", "canonical_lora"):
        raise UserError(f"config key '{key}.type={value['type']}' is not supported by rlkit: rlkit's adapters are "
                        "PEFT LoRA; use type=lora")
    if float(value.get("dropout") or 0.0) != 0.0:
        raise UserError(f"config key '{key}.dropout={value['dropout']}' is not supported by rlkit: rlkit's adapters "
                        "have no dropout (log-probs must be deterministic for the PPO ratio); set it to 0")
    dropped = sorted(set(value) & (set(TUNING) | {"dropout"}))
    rest = {k: v for k, v in value.items() if k not in dropped}
    return {key: rest}, f"nothing to set for {', '.join(dropped)} (speed or initialisation; rlkit: PEFT LoRA)"


def hf_modules(value: Any) -> Any:
    """Megatron module names as the HF projections they fuse; HF names and 'all-linear' as given; [] -> None."""
    if value is None or isinstance(value, str):
        return value
    names = [str(v) for v in value]
    if not names:
        return None
    out: list[str] = []
    for name in names:
        out += [m for m in MEGATRON_MODULES.get(name, [name]) if m not in out]
    return out


def settle_lora_section(model: Any, prefix: str = "actor_rollout_ref.model") -> None:
    """`model.lora.*` onto `model.lora_rank` ... (the older keys); both set to different values: one error line."""
    section = dict(model.lora or {})
    unknown = sorted(set(section) - set(SECTION_KEYS))
    if unknown:
        raise UserError(f"{prefix}.lora.{unknown[0]}: not a LoRA setting rlkit reads (it reads "
                        f"{', '.join(sorted(SECTION_KEYS))}; speed and initialisation keys are mapped)")
    if not section or not int(section.get("rank") or 0) > 0 and not section.get("adapter_path"):
        return  # verl's section off (rank 0): its other values ask for nothing
    if "alpha" not in section and model.lora_alpha == SECTION_KEYS["alpha"][1]:
        section["alpha"] = SECTION_ALPHA  # what verl's section scales by when the script leaves alpha out
    for key, (target, unset) in SECTION_KEYS.items():
        if key not in section:
            continue
        value = hf_modules(section[key]) if key.endswith("_modules") else section[key]
        current = getattr(model, target)
        if current != unset and current != value:
            raise UserError(f"{prefix}.lora.{key}={section[key]} and {prefix}.{target}={current} set LoRA twice "
                            f"(verl's newer and older spelling); keep one of them")
        setattr(model, target, value)
    model.lora = {}
