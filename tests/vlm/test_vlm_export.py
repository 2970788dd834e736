"""`rlkit train export` of a vision-language actor checkpoint: the folder loads with the family's
`AutoModelForImageTextToText` class and holds the trainer's weights, and its processor loads as the trainer's
(Idefics3: `AutoProcessor`; Qwen2.5-VL: its image processor, since its full processor needs torchvision)."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig
from rlkit.models.loading import load_image_processor, load_tokenizer
from rlkit.testing import save_tiny_vlm
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.hf_export import export_hf

FAMILIES = {"idefics3": "Idefics3ForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_loads_with_the_image_text_class_and_its_processor(family, tmp_path):
    from transformers import AutoModelForImageTextToText

    folder = save_tiny_vlm(tmp_path / "model", family=family)
    model = FSDPModel(str(folder), FSDPConfig(), torch.device("cpu"))
    with torch.no_grad():  # a trained weight, so the export is not the starting folder's
        next(p for n, p in model.module.named_parameters() if "vision" in n or "visual" in n).add_(0.5)
    ckpt = tmp_path / "ckpt" / "actor"
    model.save(ckpt, with_optimizer=False)
    processor = load_image_processor(folder)
    load_tokenizer(folder).save_pretrained(ckpt / "tokenizer")  # as RLTrainer.save_state writes them
    processor.save_pretrained(ckpt / "tokenizer")
    out = export_hf(ckpt, tmp_path / "exported", tokenizer_dir=ckpt / "tokenizer")

    exported = AutoModelForImageTextToText.from_pretrained(out)
    assert type(exported).__name__ == FAMILIES[family]
    state = exported.state_dict()
    trained = dict(model.iter_full_params())
    assert set(state) == set(trained) and all(torch.equal(state[k], trained[k]) for k in state)
    again = load_image_processor(out)
    assert type(again) is type(processor) and again.to_dict() == processor.to_dict()
