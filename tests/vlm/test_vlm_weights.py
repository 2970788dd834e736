"""A vision-language model's weight names, for Qwen2.5-VL and Idefics3 (SmolVLM's architecture): the engine's
contract covers the vision tower (a sync without it raises naming the missing tensors), and transformers'
in-memory names are those the checkpoint holds after the family's renames (Qwen2.5-VL: `model.language_model.`
-> `model.`, `model.visual.` -> `visual.`; Idefics3: none), which vLLM's loader reads."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors import safe_open

from rlkit.models.model_info import WeightNames
from rlkit.models.vision import freeze_vision_tower, vision_tower
from rlkit.testing import build_tiny_vlm, save_tiny_vlm

FAMILIES = {  # family -> (the vision tower's in-memory prefix, in-memory -> checkpoint renames)
    "qwen2_5_vl": ("model.visual.", {"model.language_model.": "model.", "model.visual.": "visual."}),
    "idefics3": ("model.vision_model.", {}),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny(request, tmp_path_factory):
    return request.param, save_tiny_vlm(tmp_path_factory.mktemp("vlm") / request.param, family=request.param)


def test_a_sync_without_the_vision_tower_raises(tiny):
    from transformers import AutoModelForImageTextToText

    family, path = tiny
    tower = FAMILIES[family][0]
    model = AutoModelForImageTextToText.from_pretrained(path)
    names = WeightNames.from_folder(path)
    assert any(n.startswith(tower) for n in names.shapes)
    full = names.stream(model.state_dict().items())
    assert sum(1 for _ in full) == len(names.shapes)
    full.finish()
    text_only = names.stream((n, t) for n, t in model.state_dict().items() if not n.startswith(tower))
    list(text_only)
    with pytest.raises(ValueError, match=re.escape(f"missing names ['{tower}")):
        text_only.finish()


def test_in_memory_names_are_the_checkpoints_after_the_family_renames(tiny):
    from transformers import AutoModelForImageTextToText

    family, path = tiny
    model = AutoModelForImageTextToText.from_pretrained(path)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    memory = set(model.state_dict())
    assert len(stored) == len(memory)

    def renamed(name: str) -> str:
        for old, new in FAMILIES[family][1].items():
            if name.startswith(old):
                return new + name[len(old):]
        return name

    assert {renamed(n) for n in memory} == stored


@pytest.mark.parametrize("family", list(FAMILIES))
def test_freeze_vision_tower_freezes_only_the_tower(family):
    model, _, _ = build_tiny_vlm(family=family)
    tower = {id(p) for p in vision_tower(model).parameters()}
    assert freeze_vision_tower(model) == sum(p.numel() for p in vision_tower(model).parameters())
    assert all(p.requires_grad == (id(p) not in tower) for p in model.parameters())
    assert any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="no vision tower"):
        freeze_vision_tower(torch.nn.Linear(2, 2))
