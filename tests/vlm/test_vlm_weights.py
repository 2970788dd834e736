"""A vision-language model's weight names: the engine's contract covers the vision tower (a sync without it
raises naming the missing tensors), and transformers' in-memory names are those the checkpoint (and vLLM's
loader, which maps the same prefixes) holds after the family's renames."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from rlkit.models.model_info import WeightNames
from rlkit.models.vision import freeze_vision_tower, vision_tower
from rlkit.testing import build_tiny_vlm, save_tiny_vlm


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny")


def test_a_sync_without_the_vision_tower_raises(tiny):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny)
    names = WeightNames.from_folder(tiny)
    assert any(".visual." in n for n in names.shapes)
    full = names.stream(model.state_dict().items())
    assert sum(1 for _ in full) == len(names.shapes)
    full.finish()
    text_only = names.stream((n, t) for n, t in model.state_dict().items() if ".visual." not in n)
    list(text_only)
    with pytest.raises(ValueError, match=r"missing names \['model\.visual\."):
        text_only.finish()


def test_in_memory_names_are_the_checkpoints_after_the_family_renames(tiny):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny)
    with safe_open(str(tiny / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    memory = set(model.state_dict())
    assert len(stored) == len(memory)
    renamed = {n.replace("model.language_model.", "model.").replace("model.visual.", "visual.") for n in memory}
    assert renamed == stored


def test_freeze_vision_tower_freezes_only_the_tower():
    model, _, _ = build_tiny_vlm()
    tower = {id(p) for p in vision_tower(model).parameters()}
    assert freeze_vision_tower(model) == sum(p.numel() for p in vision_tower(model).parameters())
    assert all(p.requires_grad == (id(p) not in tower) for p in model.parameters())
    assert any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="no vision tower"):
        freeze_vision_tower(torch.nn.Linear(2, 2))
