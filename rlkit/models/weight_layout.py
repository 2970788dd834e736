"""The two layouts of a model's weights: in memory (what training holds and streams) and on disk / in the
engine (what checkpoints hold and vLLM's loader reads).

For dense models they are the same names. Mixture-of-experts models differ: transformers 5 keeps the
experts of a layer fused in memory (`mlp.experts.gate_up_proj` (E, 2I, H), `mlp.experts.down_proj`)
while checkpoints and vLLM name each expert (`mlp.experts.{i}.gate_proj.weight` ...). A weight sync that
sends in-memory names to vLLM loads part of the model and silently keeps old experts, so every family
whose in-memory layout differs must be declared here; an undeclared one is refused, not guessed.

The conversion itself is transformers' own (its per-family checkpoint conversion mapping, reversed, as
`save_pretrained` does), applied one in-memory tensor at a time so a stream is never materialised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from rlkit.errors import UserError
from rlkit.registry import Registry

NamedTensors = Iterable[tuple[str, torch.Tensor]]
#: model_type -> a function (model, name, tensor) -> {checkpoint name: tensor}; declared per family
WEIGHT_LAYOUTS: Registry[Callable[[torch.nn.Module, str, torch.Tensor], dict[str, torch.Tensor]]] = Registry(
    "weight layout"
)


@WEIGHT_LAYOUTS.register("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")
def transformers_reverse_conversion(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """Fused experts -> one tensor per expert, with transformers' mapping for the family (each fused
    tensor holds all experts of one projection, so it converts on its own)."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, {name: tensor})


def has_conversions(model: torch.nn.Module) -> bool:
    """Whether transformers loads this model's checkpoints through a layout conversion (not just renames)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter

    try:
        mapping = get_model_conversion_mapping(model, add_legacy=False)
    except Exception:  # a custom (remote-code) model transformers has no mapping for
        return False
    return any(isinstance(entry, WeightConverter) for entry in mapping or [])


class WeightLayout:
    """In-memory -> checkpoint names and tensors for one model (a meta-device instance is enough)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.model_type = str(getattr(model.config, "model_type", ""))
        self.convert: Callable[[torch.nn.Module, str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        if self.model_type in WEIGHT_LAYOUTS:
            self.convert = WEIGHT_LAYOUTS.get(self.model_type)
        elif has_conversions(model):
            raise UserError(
                f"model type '{self.model_type}': transformers holds its weights in a different layout in memory "
                "than in checkpoints (e.g. fused experts), and rlkit has no declared mapping for it, so a weight "
                "sync or export would load the wrong tensors. Declare one with "
                f"@WEIGHT_LAYOUTS.register('{self.model_type}') in rlkit/models/weight_layout.py"
            )

    @property
    def identity(self) -> bool:
        return self.convert is None

    def tensor_to_checkpoint(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: tensor} if self.convert is None else self.convert(self.model, name, tensor)

    def to_checkpoint(self, named_tensors: NamedTensors) -> Iterator[tuple[str, torch.Tensor]]:
        """Lazily map an in-memory (name, tensor) stream to checkpoint names."""
        for name, tensor in named_tensors:
            yield from self.tensor_to_checkpoint(name, tensor).items()


def checkpoint_state_dict(model: torch.nn.Module, state: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """A whole state dict in checkpoint layout (export, tests)."""
    layout = WeightLayout(model)
    return dict(layout.to_checkpoint((state if state is not None else model.state_dict()).items()))
