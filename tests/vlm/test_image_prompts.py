"""Each family's image tokens: `collapse` undoes `expand` (the engine's prompt is the rendered one), and a
processor of no known family is refused with one line naming it."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from rlkit.data.image_prompts import IMAGE_PROMPTS, image_prompt
from rlkit.errors import UserError
from rlkit.testing import build_tiny_idefics3_processor, build_tiny_vlm_processor

TEXT = "<|im_start|> user {image} left or {image} right ? <|im_end|> <|im_start|> assistant"


def processors():
    tokenizer, qwen = build_tiny_vlm_processor()
    idefics3 = build_tiny_idefics3_processor(longest_edge=112, split=True)
    return {"qwen2_5_vl": (tokenizer, qwen, "<|vision_start|><|image_pad|><|vision_end|>"),
            "idefics3": (idefics3.tokenizer, idefics3, "<image>")}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3"])
def test_collapse_undoes_expand(family):
    tokenizer, processor, token = processors()[family]
    prompt = image_prompt(tokenizer, processor)
    ids = tokenizer(TEXT.format(image=token), add_special_tokens=False)["input_ids"]
    gen = torch.Generator().manual_seed(0)
    images = [Image.fromarray((torch.rand(h, w, 3, generator=gen) * 255).byte().numpy()) for w, h in
              [(112, 56), (56, 84)]]
    expanded, inputs = prompt.prepare(ids, images, "row 0")
    assert len(expanded) > len(ids) + 4 and inputs
    assert prompt.collapse(expanded) == ids
    assert prompt.collapse(ids) == ids  # already rendered: unchanged
    with pytest.raises(UserError, match=r"row 0: the (chat template rendered 2|rendered prompt has more) image tokens"):
        prompt.prepare(ids, images[:1], "row 0")


def test_a_processor_of_no_known_family_is_refused():
    with pytest.raises(UserError, match=r"processor Linear is of no vision-language family rlkit knows \(Idefics3"):
        image_prompt(None, torch.nn.Linear(1, 1))
    assert "Qwen2VLImageProcessorPil" in IMAGE_PROMPTS
