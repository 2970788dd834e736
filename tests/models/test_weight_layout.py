"""In-memory (fused experts) vs checkpoint (per-expert) weight layouts, for two MoE families and a dense model."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rlkit.errors import UserError
from rlkit.models import weight_layout
from rlkit.models.model_info import WeightNames
from rlkit.models.weight_layout import WeightLayout, checkpoint_state_dict
from rlkit.registry import Registry
from rlkit.testing import MOE_FAMILIES, build_tiny_model, build_tiny_moe, build_tiny_tokenizer, save_tiny_moe


def saved_tensors(folder) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_checkpoint_layout_is_what_save_pretrained_writes(family, tmp_path):
    model, _ = build_tiny_moe(family)
    folder = save_tiny_moe(tmp_path / family, family)
    on_disk = saved_tensors(folder)
    fused = [n for n in model.state_dict() if n.endswith("experts.gate_up_proj")]
    assert fused, "the in-memory layout is expected to hold fused experts"
    converted = checkpoint_state_dict(model)
    assert set(converted) == set(on_disk)
    assert all(torch.equal(converted[k], on_disk[k]) for k in on_disk)
    names = WeightNames.from_folder(folder)  # meta device, checkpoint layout
    assert {k: tuple(v) for k, v in names.shapes.items()} == {k: tuple(v.shape) for k, v in on_disk.items()}


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_round_trip_fused_to_per_expert_to_fused_is_identity(family, tmp_path):
    model, _ = build_tiny_moe(family, seed=3)
    folder = tmp_path / "rt"
    model.save_pretrained(folder)
    stream = WeightNames.from_folder(folder).stream(model.state_dict().items())  # in-memory -> checkpoint
    converted = dict(stream)
    stream.finish()
    from safetensors.torch import save_file

    save_file(converted, str(folder / "model.safetensors"))
    again = AutoModelForCausalLM.from_pretrained(folder).state_dict()  # checkpoint -> in-memory (transformers)
    assert set(again) == set(model.state_dict())
    assert all(torch.equal(again[k], v) for k, v in model.state_dict().items())


def test_a_missing_fused_tensor_raises_naming_every_expert(tmp_path):
    model, _ = build_tiny_moe("qwen3_moe")
    folder = save_tiny_moe(tmp_path / "m")
    dropped = "model.layers.1.mlp.experts.down_proj"
    stream = WeightNames.from_folder(folder).stream((k, v) for k, v in model.state_dict().items() if k != dropped)
    for _ in stream:
        pass
    with pytest.raises(ValueError, match=r"8 missing names \['model.layers.1.mlp.experts.0.down_proj.weight'"):
        stream.finish()


def test_in_memory_names_sent_to_a_checkpoint_layout_are_refused(tmp_path):
    """What a sync without the mapping did: fused names reach a per-expert loader; now they are unknown."""
    model, _ = build_tiny_moe("qwen3_moe")
    folder = save_tiny_moe(tmp_path / "m")
    names = WeightNames.from_folder(folder)
    from rlkit.models.model_info import WeightStream

    stream = WeightStream(names, model.state_dict().items())  # no conversion on purpose
    list(stream)
    with pytest.raises(ValueError, match="unknown names.*experts.gate_up_proj"):
        stream.finish()


def test_dense_models_have_the_identity_layout():
    model = build_tiny_model(build_tiny_tokenizer())
    layout = WeightLayout(model)
    assert layout.identity
    assert set(checkpoint_state_dict(model)) == set(model.state_dict())


def test_an_undeclared_family_with_a_fused_layout_is_refused(monkeypatch):
    model, _ = build_tiny_moe("mixtral")
    monkeypatch.setattr(weight_layout, "WEIGHT_LAYOUTS", Registry("weight layout"))
    with pytest.raises(UserError, match=r"model type 'mixtral'.*WEIGHT_LAYOUTS.register\('mixtral'\)"):
        WeightLayout(model)
