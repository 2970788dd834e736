"""LoRA with `peft`: the adapter config from our keys, wrapping, the merged weight stream, adapter files.

Why here (the models layer): the trainer's FSDP2 actor, the rollout weight sync, `rlkit export` and
`rlkit eval` all need the same four facts about an adapter, and none of them should know peft's
naming. What this module owns:

- `lora_enabled` / `lora_config`: `actor_rollout_ref.model.lora_*` -> `peft.LoraConfig`
  (`lora_adapter_path` instead loads an existing PEFT adapter, its own config wins);
- `wrap_lora`: inject the adapter into an HF model in place (peft's LoRA layers; the base is
  frozen by peft), returning a `LoraModel` handle: the peft wrapper, `disabled()` (the reference
  policy is the base with the adapter off), the trainable parameters;
- `merged_named_tensors`: turn the wrapped model's (name, full tensor) stream into the base
  model's HF names with `W + scaling * B @ A` folded in, one layer at a time, so an engine that
  knows nothing of LoRA loads it (`WeightStream` checks the names against the base's);
- `adapter_state_dict` / `save_adapter_folder`: the adapter alone in PEFT's file layout
  (`adapter_config.json` + `adapter_model.safetensors`), what `PeftModel.from_pretrained` and
  vLLM's `LoRARequest` load.

The wrapped HF model keeps its own class and module tree (peft replaces the targeted `nn.Linear`
modules by `peft.tuners.lora.Linear` holding `base_layer`, `lora_A.<adapter>`, `lora_B.<adapter>`),
so FSDP2 shards it exactly like the plain model and its state-dict names are the base's with
`.base_layer` inserted plus the adapter tensors.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlkit.errors import UserError

ADAPTER_NAME = "default"  # peft's name for the one adapter we train
PEFT_PREFIX = "base_model.model."  # what peft puts before the HF names in an adapter file
ADAPTER_PART = re.compile(r"^(?P<module>.+)\.lora_(?P<part>A|B)\.(?P<adapter>[^.]+)\.weight$")
BASE_PART = re.compile(r"^(?P<module>.+)\.base_layer\.(?P<tensor>weight|bias)$")
LORA_INFO_FILE = "lora.json"  # in a checkpoint's actor folder: base model + peft config of the adapter


def lora_enabled(model_cfg: Any) -> bool:
    """Whether `actor_rollout_ref.model` asks for LoRA (a rank, or an adapter to start from)."""
    return int(getattr(model_cfg, "lora_rank", 0) or 0) > 0 or bool(getattr(model_cfg, "lora_adapter_path", None))


def lora_config(model_cfg: Any):
    """`peft.LoraConfig` from `lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules` (no dropout:
    log-probs must be deterministic for PPO ratios and exact resume)."""
    from peft import LoraConfig

    rank = int(model_cfg.lora_rank)
    if rank < 1:
        raise UserError(f"actor_rollout_ref.model.lora_rank={rank}: LoRA needs a rank >= 1 (0 turns LoRA off)")
    targets = model_cfg.target_modules
    if not isinstance(targets, str):
        targets = [str(t) for t in targets]
    exclude = model_cfg.exclude_modules
    if exclude is not None and not isinstance(exclude, str):
        exclude = [str(e) for e in exclude]
    return LoraConfig(
        r=rank,
        lora_alpha=float(model_cfg.lora_alpha),
        target_modules=targets,
        exclude_modules=exclude,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


@dataclass
class LoraModel:
    """An HF model with a peft adapter injected; `hf_model` is the module to shard, train and stream."""

    peft_model: Any  # peft.PeftModel wrapping hf_model
    hf_model: torch.nn.Module

    @property
    def config(self):
        return self.peft_model.peft_config[ADAPTER_NAME]

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """The base model: inside this block every LoRA layer returns its base layer's output.

        peft also marks the adapters `requires_grad=False` for the block. The adapters stay trainable here instead:
        FSDP2 reads which parameters are trainable at its first forward (their dtype is the dtype it reduces
        gradients to), and the first forward of a run is often the reference's; with nothing trainable then, bf16
        gradients later met float32 adapters ("attempting to assign a gradient with dtype BFloat16")."""
        trainable = self.trainable_parameters()
        with self.peft_model.disable_adapter():
            for p in trainable:
                p.requires_grad_(True)
            yield

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.hf_model.parameters() if p.requires_grad]

    def scalings(self) -> dict[str, tuple[float, bool]]:
        """HF module name -> (scaling, fan_in_fan_out) of each adapted linear layer."""
        from peft.tuners.lora import Linear as LoraLinear

        out = {}
        for name, module in self.hf_model.named_modules():
            if isinstance(module, LoraLinear) and ADAPTER_NAME in module.lora_A:
                out[name] = (float(module.scaling[ADAPTER_NAME]), bool(module.fan_in_fan_out))
        return out

    def info(self, base_model: str) -> dict:
        """What a checkpoint records to rebuild this adapter without the run config (`rlkit export`)."""
        return {"base_model": str(base_model), "peft_config": self.config.to_dict()}


def wrap_lora(hf_model: torch.nn.Module, model_cfg: Any, adapter_dtype: torch.dtype | None = None) -> LoraModel:
    """Inject the adapter into `hf_model` (in place) and freeze everything else.

    `lora_adapter_path` loads that PEFT adapter as trainable (its rank/alpha/targets win); otherwise a
    fresh adapter from `lora_config` (B = 0: the wrapped model starts equal to the base).
    `adapter_dtype` stores the adapter in that dtype (float32 when the base is stored in bf16)."""
    from peft import PeftModel, get_peft_model

    path = getattr(model_cfg, "lora_adapter_path", None)
    if path:
        folder = Path(path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise UserError(
                f"actor_rollout_ref.model.lora_adapter_path={path}: no adapter_config.json there; "
                "pass a folder written by peft's save_pretrained or `rlkit export --adapter-only`"
            )
        peft_model = PeftModel.from_pretrained(hf_model, str(folder), is_trainable=True)
    else:
        config = lora_config(model_cfg)
        try:
            peft_model = get_peft_model(hf_model, config)
        except ValueError as exc:  # peft's NoMatchingPeftModuleError
            raise UserError(
                f"LoRA: target_modules={model_cfg.target_modules!r} matched no linear layer of the model ({exc}); "
                "name modules that exist (e.g. [q_proj, v_proj]) or use all-linear"
            ) from None
    cfg = peft_model.peft_config[ADAPTER_NAME]
    if getattr(cfg, "use_dora", False):
        raise UserError("DoRA adapters are not supported (the merged weight stream is plain LoRA); use a LoRA adapter")
    handle = LoraModel(peft_model, hf_model)
    for name, p in hf_model.named_parameters():
        if p.requires_grad and ".lora_" not in name:
            raise UserError(f"LoRA: {name} would train outside the adapter (modules_to_save/bias are not supported)")
    if adapter_dtype is not None:
        for p in handle.trainable_parameters():
            p.data = p.data.to(adapter_dtype)
    if not handle.scalings():
        raise UserError(
            f"LoRA: target_modules={cfg.target_modules!r} matched no linear layer of the model; "
            "name modules that exist (e.g. [q_proj, v_proj]) or use all-linear"
        )
    return handle


# ---------------------------------------------------------------------------------- weight streams
def hf_name(name: str) -> str:
    """The base model's name of a wrapped model's base tensor (`x.q_proj.base_layer.weight` -> `x.q_proj.weight`)."""
    return name.replace(".base_layer.", ".")


def merged_named_tensors(
    named: Iterable[tuple[str, torch.Tensor]], scalings: dict[str, tuple[float, bool]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Wrapped-model (name, full tensor) -> base-model (HF name, tensor) with the adapter merged in.

    A layer's base weight is held until its lora_A and lora_B arrive (adjacent in a state dict), then
    `W + scaling * (B @ A)` is yielded in W's dtype (computed in float32); everything else passes
    through renamed. Raises if a layer's three parts never all arrive."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        adapter = ADAPTER_PART.match(name)
        base = BASE_PART.match(name)
        module = adapter["module"] if adapter else (base["module"] if base and base["tensor"] == "weight" else None)
        if module is None or module not in scalings:
            yield hf_name(name), tensor
            continue
        if adapter is not None and adapter["adapter"] != ADAPTER_NAME:
            raise ValueError(f"LoRA merge: unexpected adapter name in {name} (only '{ADAPTER_NAME}' is trained)")
        parts = waiting.setdefault(module, {})
        parts[adapter["part"] if adapter else "W"] = tensor
        if len(parts) == 3:
            del waiting[module]
            yield f"{module}.weight", merge_weight(parts["W"], parts["A"], parts["B"], *scalings[module])
    if waiting:
        raise ValueError(
            f"LoRA merge: incomplete layers {sorted(waiting)[:4]} (base weight, lora_A and lora_B "
            "of each adapted layer must all be streamed)"
        )


def merge_weight(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float, fan_in_fan_out: bool = False
) -> torch.Tensor:
    """`W + scaling * B @ A` (transposed for fan-in-fan-out layers), in float32, returned in W's dtype."""
    delta = (b.float() @ a.float()) * scaling
    if fan_in_fan_out:
        delta = delta.T
    return (weight.float() + delta.to(weight.device)).to(weight.dtype)


def adapter_state_dict(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a wrapped-model stream under PEFT's file names
    (`base_model.model.<module>.lora_A.weight`: prefixed, adapter name dropped)."""
    out = {}
    for name, tensor in named:
        m = ADAPTER_PART.match(name)
        if m is not None:
            out[f"{PEFT_PREFIX}{m['module']}.lora_{m['part']}.weight"] = tensor.detach().cpu().contiguous()
    return out


def save_adapter_folder(
    out: Path, peft_config: Any, tensors: dict[str, torch.Tensor], base_model: str | None = None
) -> Path:
    """Write a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(peft_config, dict):
        peft_config = peft_config_from_dict(peft_config)
    if base_model is not None:
        peft_config.base_model_name_or_path = str(base_model)
    peft_config.save_pretrained(str(out))
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out


def peft_config_from_dict(data: dict):
    """A `LoraConfig` from its `to_dict()` (what `LORA_INFO_FILE` stores)."""
    from peft import LoraConfig

    fields = dict(data)
    fields.pop("peft_type", None)
    for key in ("target_modules", "exclude_modules"):  # to_dict writes sets as lists already; be safe
        if isinstance(fields.get(key), set):
            fields[key] = sorted(fields[key])
    known = set(LoraConfig.__dataclass_fields__)
    return LoraConfig(**{k: v for k, v in fields.items() if k in known})


def write_lora_info(folder: Path, info: dict) -> None:
    (Path(folder) / LORA_INFO_FILE).write_text(json.dumps(info, indent=1, default=list))


def read_lora_info(folder: Path) -> dict | None:
    """The adapter info a checkpoint's actor folder holds, or None (a full fine-tuning checkpoint)."""
    path = Path(folder) / LORA_INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def is_adapter_folder(path: str | Path) -> bool:
    """A PEFT adapter folder (what `rlkit eval` accepts in place of a model)."""
    return (Path(path).expanduser() / "adapter_config.json").is_file()


def load_merged_from_adapter(
    adapter_dir: str | Path, base_model: str | Path | None = None, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """Base model + a PEFT adapter folder, merged into a plain HF model (eval, export)."""
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    adapter_dir = Path(adapter_dir).expanduser()
    base = base_model or PeftConfig.from_pretrained(str(adapter_dir)).base_model_name_or_path
    if not base:
        raise UserError(f"{adapter_dir}: the adapter names no base model; pass the base model's folder")
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
