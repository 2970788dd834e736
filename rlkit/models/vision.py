"""What a vision-language model's forward reads besides the tokens: the images' pixel patches and grids, and, for
the Qwen2-VL family, 3-D rotary positions (temporal, height, width) that place each image token on its grid.

The dataset carries each row's processor output (`multi_modal_inputs`; Qwen: `pixel_values` (patches, dim),
`image_grid_thw` (images, 3); Idefics3: `pixel_values` (tiles, 3, H, W), `pixel_attention_mask` (tiles, H, W));
`batch_images` joins a micro-batch's in row order (in the layout the family's forward reads), which is the
order their image tokens take in the padded rows and in the packed row alike (packing keeps every valid token,
rows in order). `rope_positions` computes the positions with the model's own `get_rope_index` from the token ids,
the mask and the grids, so the rollout, the log-prob passes and the update see the same ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from rlkit.registry import Registry


def is_vision_model(config: Any) -> bool:
    """A config with a vision tower (Qwen2-VL/2.5-VL/3-VL, Idefics3/SmolVLM, Gemma3, ...)."""
    return getattr(config, "vision_config", None) is not None


def placeholder_token_ids(config: Any) -> list[int]:
    """The image/video pad tokens a VLM's forward replaces with vision features. They belong in prompts only: a
    sampled one would leave the trainer's forward with more pads than images, so rollouts never sample them."""
    ids = [getattr(config, name, None) for name in ("image_token_id", "video_token_id")]
    return [int(i) for i in ids if i is not None] if is_vision_model(config) else []


def causal_lm_class(config: Any) -> str:
    """The transformers Auto class that loads this config with its LM head: a VLM's is the image-text one."""
    return "AutoModelForImageTextToText" if is_vision_model(config) else "AutoModelForCausalLM"


VISION_TOWERS = ("visual", "vision_tower", "vision_model")  # Qwen2-VL family; Gemma3/LLaVA; Idefics3/SmolVLM


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The image encoder (with its projector where the family keeps it inside), or None for a text model."""
    for inner in (model, getattr(model, "model", None)):
        for name in VISION_TOWERS:
            tower = getattr(inner, name, None) if inner is not None else None
            if isinstance(tower, torch.nn.Module):
                return tower
    return None


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop training the image encoder (verl's `freeze_vision_tower`); returns how many parameters froze."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError("freeze_vision_tower=true but the model has no vision tower (a text model)")
    frozen = 0
    for p in tower.parameters():
        p.requires_grad_(False)
        frozen += p.numel()
    return frozen


IMAGE_BATCH_LAYOUTS: Registry[Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = Registry(
    "image batch layout (model_type)")  # a family whose forward reads the joined images as one batch (new dim 0)


@IMAGE_BATCH_LAYOUTS.register("idefics3", "smolvlm")
def _one_batch_of_images(images: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Idefics3's forward reads (batch, images, ...) and drops all-zero padding images: one batch of them all."""
    return {k: v.unsqueeze(0) for k, v in images.items()}


def batch_images(rows: Sequence[Any] | None, config: Any = None) -> dict[str, torch.Tensor]:
    """The rows' processor outputs (each tensor with images or patches on dim 0) joined in row order, laid out
    as the forward of `config`'s family reads them (empty when no row has an image)."""
    parts = [r for r in (rows if rows is not None else []) if r]
    if not parts:
        return {}
    joined = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    model_type = getattr(config, "model_type", None)
    return IMAGE_BATCH_LAYOUTS.get(model_type)(joined) if model_type in IMAGE_BATCH_LAYOUTS else joined


def model_config(module: torch.nn.Module) -> Any:
    """The HF config of a model, under whatever wraps it (LoRA, FSDP), or None."""
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is not None and hasattr(config, "model_type"):
            return config
    return None


def _rope_owner(module: torch.nn.Module) -> Any:
    """The submodule that owns `get_rope_index` (the inner VL model under a wrapper, LoRA or FSDP), or None."""
    for sub in module.modules():
        if callable(getattr(type(sub), "get_rope_index", None)):
            return sub
    return None


def uses_rope_positions(module: torch.nn.Module) -> bool:
    return _rope_owner(module) is not None


def rope_positions(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   position_ids: torch.Tensor, images: dict[str, torch.Tensor]) -> torch.Tensor:
    """(4, b, S) positions: the 1-D text positions (what packing and masks read), then the model's 3-D rotary
    positions (its `get_rope_index` over the valid tokens; padding at 0)."""
    owner = _rope_owner(module)
    config = owner.config
    image_token = getattr(config, "image_token_id", None)
    if image_token is None:
        image_token = config.image_token_index
    types = (input_ids == image_token).int()
    grid = images.get("image_grid_thw")
    if grid is None:  # text only: the three rotary axes are the text positions
        return position_ids.unsqueeze(0).expand(4, -1, -1).clone()
    rope, _ = owner.get_rope_index(input_ids, mm_token_type_ids=types, image_grid_thw=grid.to(input_ids.device),
                                   attention_mask=attention_mask)
    return torch.cat([position_ids.unsqueeze(0), rope.to(position_ids.dtype)])


def join_image_batches(parts: Sequence[dict[str, torch.Tensor]], config: Any) -> dict[str, torch.Tensor]:
    """Micro-batches' images, each as `batch_images` laid them out, joined in order (sequence parallelism: the
    group's). A family's layout puts its images in one batch (a new dim 0), so theirs join on dim 1."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    dim = 1 if getattr(config, "model_type", None) in IMAGE_BATCH_LAYOUTS else 0
    return {key: torch.cat([p[key] for p in parts], dim) for key in parts[0]}


TEXT_MODELS = ("language_model", "text_model")  # Qwen2-VL family / Gemma3 / LLaVA; Idefics3/SmolVLM


def text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The language model inside a VLM: what reads the merged (token + image feature) embeddings."""
    for sub in model.modules():
        for name in TEXT_MODELS:
            inner = getattr(sub, name, None)
            if isinstance(inner, torch.nn.Module):
                return inner
    raise ValueError(f"{type(model).__name__} has no language model under {TEXT_MODELS}")


@contextlib.contextmanager
def text_embeddings_sliced(model: torch.nn.Module, lo: int, hi: int) -> Iterator[None]:
    """Inside: the VLM embeds and merges the image features into the whole row it is given, and its language model
    reads tokens [lo, hi) of the merged embeddings (sequence parallelism: this rank's slice; the image tokens of a
    sequence may fall in another rank's slice, so the merge needs the full row). Positions and the other keywords
    are given already sliced."""

    def take_slice(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise ValueError("the VLM's language model got no inputs_embeds to slice")
        return args, dict(kwargs, inputs_embeds=embeds[:, lo:hi])

    handle = text_model(model).register_forward_pre_hook(take_slice, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
