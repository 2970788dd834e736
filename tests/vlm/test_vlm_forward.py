"""The trainer's forward of a tiny Qwen2.5-VL with images equals a plain transformers forward of each row alone
with the same processor outputs: padded and packed, 0, 1 and 2 images per row (the 3-D rotary positions and the
pixel patches travel with the rows)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from rlkit.config.schema import FSDPConfig
from rlkit.data.images import VisionTokens, process_images
from rlkit.testing import save_tiny_vlm
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.model_inputs import ModelInputs
from tests.vlm.batches import padded_batch

PROMPTS = [  # (text, image sizes)
    ("<|im_start|> user what colour is the shape ? <|im_end|> <|im_start|> assistant", []),
    ("<|im_start|> user <|vision_start|><|image_pad|><|vision_end|> how many shapes ? <|im_end|> "
     "<|im_start|> assistant", [(56, 56)]),
    ("<|im_start|> user <|vision_start|><|image_pad|><|vision_end|> left or <|vision_start|><|image_pad|>"
     "<|vision_end|> right ? <|im_end|> <|im_start|> assistant", [(112, 56), (56, 84)]),
]
RESPONSES = [[20, 21, 22, 23, 5], [30, 31, 5], [40, 41, 42, 43, 44, 45]]


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from transformers import AutoImageProcessor, AutoTokenizer

    path = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny")
    return path, AutoTokenizer.from_pretrained(path), AutoImageProcessor.from_pretrained(path)


def rows_of(tokenizer, image_processor):
    """Each row's prompt ids (image pads widened), response ids and processor output."""
    gen = torch.Generator().manual_seed(0)
    vision = VisionTokens.of(tokenizer, image_processor)
    out = []
    for (text, sizes), response in zip(PROMPTS, RESPONSES, strict=True):
        images = [Image.fromarray((torch.rand(h, w, 3, generator=gen) * 255).byte().numpy()) for w, h in sizes]
        mm = process_images(image_processor, images)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = vision.expand(ids, mm["image_grid_thw"], "test") if mm else ids
        out.append((ids, response, mm))
    return out


def reference_log_probs(model, ids, response, mm, image_token_id):
    full = torch.tensor([ids + response])
    kwargs = dict(mm)
    if mm:
        kwargs["mm_token_type_ids"] = (full == image_token_id).int()
    with torch.no_grad():
        logits = model(input_ids=full, **kwargs).logits[0].float()
    lp = torch.log_softmax(logits[len(ids) - 1 : -1], -1)
    return lp.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_trainer_log_probs_equal_a_plain_forward(vlm, packed):
    from transformers import AutoModelForImageTextToText

    path, tokenizer, image_processor = vlm
    rows = rows_of(tokenizer, image_processor)
    model = FSDPModel(str(path), FSDPConfig(), torch.device("cpu"))
    plain = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    input_ids, mask, pos, r_mask = padded_batch(rows, tokenizer.pad_token_id)
    resp_len = r_mask.shape[1]
    inputs = ModelInputs.of(input_ids, mask, pos).with_images(model.module, [r[2] for r in rows])
    assert inputs.extras["position_ids"].value.shape == (4, len(rows), input_ids.shape[1])
    with torch.no_grad():
        out = model.forward(inputs, response_length=resp_len, remove_padding=packed)
    image_token = model.config.image_token_id
    for i, (ids, resp, mm) in enumerate(rows):
        want = reference_log_probs(plain, ids, resp, mm, image_token)
        torch.testing.assert_close(out.log_probs[i, : len(resp)], want, atol=1e-5, rtol=0)
    # the images matter: without them the row with two images scores differently
    blind = ModelInputs.of(input_ids, mask, pos).with_images(model.module, [{}, {}, {}])
    with torch.no_grad():
        other = model.forward(blind, response_length=resp_len, remove_padding=packed)
    assert not torch.allclose(other.log_probs[2, :6], out.log_probs[2, :6], atol=1e-4)
    torch.testing.assert_close(other.log_probs[0], out.log_probs[0], atol=1e-5, rtol=0)


def test_one_bf16_worker_computes_as_fsdp2_with_images(vlm, process_group):
    """bf16 on one worker (the compute copy, rlkit/workers/compute_copy.py) casts the pixel values as FSDP2 does.
    The text-only row's log-probs equal FSDP2's to the bit; rows with images differ by bf16 rounding (measured
    2e-3), because FSDP2 also casts each vision block's inputs (its fp32 rotary tables) where the copy leaves the
    model's own fp32 rotary maths, as a plain bf16 forward does."""
    path, tokenizer, image_processor = vlm
    rows = rows_of(tokenizer, image_processor)
    input_ids, mask, pos, r_mask = padded_batch(rows, tokenizer.pad_token_id)
    resp_len = r_mask.shape[1]
    results = []
    for shard in (True, False):
        model = FSDPModel(str(path), FSDPConfig(param_dtype="bfloat16", shard_single_worker=shard), torch.device("cpu"))
        assert (model.compute_copy is None) == shard
        inputs = ModelInputs.of(input_ids, mask, pos).with_images(model.module, [r[2] for r in rows])
        out = model.forward(inputs, response_length=resp_len)
        out.log_probs.sum().backward()
        grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                 for n, p in model.module.named_parameters()}
        results.append((out.log_probs.detach(), grads))
    (want_lp, want_grads), (got_lp, got_grads) = results
    torch.testing.assert_close(got_lp[0], want_lp[0], atol=0, rtol=0)  # no image
    torch.testing.assert_close(got_lp, want_lp, atol=1e-2, rtol=0)
    assert not torch.equal(got_lp[1:], want_lp[1:])  # the images did go through the vision tower in bf16
    assert got_grads.keys() == want_grads.keys()
    scale = max(g.abs().max() for g in want_grads.values())
    for name, want in want_grads.items():
        assert got_grads[name].dtype == torch.float32, name
        torch.testing.assert_close(got_grads[name], want, atol=2e-2 * scale, rtol=0, msg=name)
