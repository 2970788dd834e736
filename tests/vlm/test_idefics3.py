"""The second VLM family, Idefics3 (SmolVLM's architecture): its image tokens in the dataset's ids equal its own
processor's expansion (with and without tiling) and collapse back to the rendered prompt; the trainer's log-probs
of a tiny random Idefics3 equal a plain transformers forward of each row alone, padded and packed, with 0, 1 and
2 images per row; the folder loads with `AutoModelForImageTextToText` and `AutoProcessor`."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from rlkit.config.schema import FSDPConfig
from rlkit.data.dataset import RLDataset
from rlkit.data.image_prompts import Idefics3ImagePrompt, image_prompt
from rlkit.data.images import with_image_parts
from rlkit.data.schema import arrow_schema
from rlkit.errors import UserError
from rlkit.models.loading import load_image_processor, load_tokenizer
from rlkit.testing import build_tiny_idefics3_processor, save_tiny_idefics3
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.model_inputs import ModelInputs
from tests.vlm.batches import padded_batch

PROMPTS = [  # (user text with one <image> per image, image sizes (w, h))
    ("what colour is the shape ?", []),
    ("<image> how many shapes ?", [(56, 40)]),
    ("<image> left or <image> right ?", [(112, 56), (30, 56)]),
]
RESPONSES = [[20, 21, 22, 23, 5], [30, 31, 5], [40, 41, 42, 43, 44, 45]]


def random_images(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(h, w, 3, generator=gen) * 255).byte().numpy()) for w, h in sizes]


def rendered(tokenizer, text: str) -> tuple[list[int], str]:
    """The chat template's ids and text of one user turn, each `<image>` an image part (as the dataset does)."""
    messages = with_image_parts([{"role": "user", "content": text}], text.count("<image>"), "test")
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(chat, add_special_tokens=False)["input_ids"], chat


@pytest.mark.parametrize("split", [False, True], ids=["global", "tiled"])
def test_expansion_equals_the_processor_and_collapses_back(split):
    proc = build_tiny_idefics3_processor(longest_edge=112 if split else 56, split=split)
    prompt = image_prompt(proc.tokenizer, proc)
    assert isinstance(prompt, Idefics3ImagePrompt)
    for text, sizes in PROMPTS:
        images = random_images(sizes)
        ids, chat = rendered(proc.tokenizer, text)
        expanded, inputs = prompt.prepare(ids, images, "test row")
        if not images:
            assert expanded == ids and inputs == {}
            continue
        want = proc(text=[chat], images=[images], return_tensors="pt")
        assert expanded == want["input_ids"][0].tolist()
        torch.testing.assert_close(inputs["pixel_values"], want["pixel_values"][0], atol=0, rtol=0)
        assert set(inputs) == {"pixel_values", "pixel_attention_mask"}
        assert prompt.collapse(expanded) == ids
        assert sum(t == prompt.image_token_id for t in expanded) == 4 * inputs["pixel_values"].shape[0]
    if split:  # the 112x56 picture: 2 tiles of 56 and the global image
        assert prompt.process(random_images([(112, 56)]))["pixel_values"].shape[0] == 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3") / "tiny")


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    random_images([(width, height)])[0].save(out, format="PNG")
    return out.getvalue()


def test_dataset_rows_and_export_loading(folder, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(folder)
    assert type(model).__name__ == "Idefics3ForConditionalGeneration"
    assert type(AutoProcessor.from_pretrained(folder)).__name__ == "Idefics3Processor"
    processor = load_image_processor(folder)
    assert type(processor).__name__ == "Idefics3Processor"
    rows = [{"data_source": "rlkit/shapes", "prompt": [{"role": "user", "content": text}], "ability": "vision",
             "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"split": "train", "index": i},
             "images": [{"bytes": png(w, h), "path": None} for w, h in sizes]}
            for i, (text, sizes) in enumerate(PROMPTS)]
    rows.append({**rows[1], "prompt": [{"role": "user", "content": "<image> <image> how many ?"}]})
    pq.write_table(pa.Table.from_pylist(rows[:3], schema=arrow_schema(images=True)), tmp_path / "d.parquet")
    data = RLDataset(tmp_path / "d.parquet", load_tokenizer(folder), 128, image_processor=processor)
    image_token = processor.image_token_id
    assert [int((data[i]["input_ids"] == image_token).sum()) for i in range(3)] == [0, 4, 8]
    assert data[2]["multi_modal_inputs"]["pixel_values"].shape == (2, 3, 56, 56)
    pq.write_table(pa.Table.from_pylist(rows[3:], schema=arrow_schema(images=True)), tmp_path / "bad.parquet")
    with pytest.raises(UserError, match=r"bad.parquet row 0, column 'prompt': 2 <image> placeholders .* 1 images"):
        RLDataset(tmp_path / "bad.parquet", load_tokenizer(folder), 128, image_processor=processor)


def idefics3_rows(path) -> tuple[list, int]:
    """PROMPTS with their images and RESPONSES as (ids, response, processor output) rows, and the pad id."""
    processor = load_image_processor(path)
    prompt = image_prompt(processor.tokenizer, processor)
    rows = []
    for (text, sizes), response in zip(PROMPTS, RESPONSES, strict=True):
        ids, mm = prompt.prepare(rendered(processor.tokenizer, text)[0], random_images(sizes), "test")
        rows.append((ids, response, mm))
    return rows, processor.tokenizer.pad_token_id


def reference_log_probs(model, ids, response, mm):
    full = torch.tensor([ids + response])
    kwargs = {k: v.unsqueeze(0) for k, v in mm.items()}
    with torch.no_grad():
        logits = model(input_ids=full, **kwargs).logits[0].float()
    lp = torch.log_softmax(logits[len(ids) - 1 : -1], -1)
    return lp.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_trainer_log_probs_equal_a_plain_forward(folder, packed):
    from transformers import AutoModelForImageTextToText

    processor = load_image_processor(folder)
    prompt = image_prompt(processor.tokenizer, processor)
    rows, pad = idefics3_rows(folder)
    model = FSDPModel(str(folder), FSDPConfig(), torch.device("cpu"))
    plain = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    input_ids, mask, pos, r_mask = padded_batch(rows, pad)
    resp_len = r_mask.shape[1]
    inputs = ModelInputs.of(input_ids, mask, pos).with_images(model.module, [r[2] for r in rows])
    assert inputs.images["pixel_values"].shape == (1, 3, 3, 56, 56) and not inputs.extras
    with torch.no_grad():
        out = model.forward(inputs, response_length=resp_len, remove_padding=packed)
    for i, (ids, resp, mm) in enumerate(rows):
        want = reference_log_probs(plain, ids, resp, mm)
        torch.testing.assert_close(out.log_probs[i, : len(resp)], want, atol=1e-5, rtol=0)
    # the images matter: other pictures change the rows that have them, not the one without
    other_rows = [prompt.prepare(rendered(processor.tokenizer, t)[0], random_images(s, seed=1), "test")[1]
                  for t, s in PROMPTS]
    other = ModelInputs.of(input_ids, mask, pos).with_images(model.module, other_rows)
    with torch.no_grad():
        moved = model.forward(other, response_length=resp_len, remove_padding=packed)
    assert not torch.allclose(moved.log_probs[2, :6], out.log_probs[2, :6], atol=1e-4)
    torch.testing.assert_close(moved.log_probs[0], out.log_probs[0], atol=1e-5, rtol=0)
