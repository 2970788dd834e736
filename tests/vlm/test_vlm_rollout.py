"""The HF rollout generates from prompts with images (the rows' processor output), Qwen2.5-VL and Idefics3
alike; what it sampled has the trainer's log-probs of a plain transformers forward with the same images, and the
engine's are those of the same distribution without the image tokens (never sampled: they stand for image
features)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from data_prep.shapes import generate, make_row
from rlkit.config.rollout import RolloutConfig
from rlkit.config.schema import FSDPConfig
from rlkit.data.dataset import RLDataset
from rlkit.data.images import MODEL_INPUTS
from rlkit.data.schema import arrow_schema
from rlkit.models.loading import load_image_processor, load_tokenizer
from rlkit.models.vision import batch_images, uses_rope_positions
from rlkit.rollout.hf_rollout import HFRollout
from rlkit.testing import save_tiny_vlm
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.model_inputs import ModelInputs


def plain_log_probs(model, ids, mask, mm, response_length, banned):
    """A plain transformers forward of one row's valid tokens: log-probs of its response tokens over the full
    vocabulary, and without the `banned` ones."""
    keep = mask.bool()
    full = ids[keep].unsqueeze(0)
    kwargs = batch_images([mm], model.config)  # the row's images as the family's forward reads them
    if mm and uses_rope_positions(model):
        kwargs["mm_token_type_ids"] = (full == model.config.image_token_id).int()
    with torch.no_grad():
        logits = model(input_ids=full, **kwargs).logits[0].float()
    n = int(keep[-response_length:].sum())
    targets = full[0, -n:].unsqueeze(1)
    pick = logits[-n - 1 : -1]
    without = pick.clone()
    without[:, banned] = -float("inf")
    return (torch.log_softmax(pick, -1).gather(1, targets).squeeze(1),
            torch.log_softmax(without, -1).gather(1, targets).squeeze(1))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3"])
def test_hf_rollout_with_images_matches_the_trainer(tmp_path, family):
    from transformers import AutoModelForImageTextToText

    path = save_tiny_vlm(tmp_path / "tiny", family=family)
    rows = [make_row(r, "train", i) for i, r in enumerate(generate("train", 4, ["count", "colour"], 0).records)]
    rows[3] = {**rows[3], "prompt": [{"role": "user", "content": "what colour is the shape ?"}], "images": []}
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(images=True)), tmp_path / "d.parquet")
    tokenizer = load_tokenizer(path)
    data = RLDataset(tmp_path / "d.parquet", tokenizer, 64, image_processor=load_image_processor(path))
    prompts = data.get_batch(range(4)).repeat(2)
    config = RolloutConfig(name="hf", response_length=6, temperature=1.0, calculate_log_probs=True, max_num_seqs=4,
                           seed=3)
    engine = HFRollout(path, config)
    out = engine.generate(prompts, config.to_sampling())
    mask = out["response_mask"].bool()
    assert mask.sum() > 8 and len(out.non_tensors[MODEL_INPUTS]) == 8
    assert not torch.isin(out["responses"][mask], torch.tensor(engine.suppressed)).any()

    model = FSDPModel(str(path), FSDPConfig(), torch.device("cpu"))
    inputs = ModelInputs.of(out["input_ids"], out["attention_mask"], out["position_ids"])
    inputs = inputs.with_images(model.module, list(out.non_tensors[MODEL_INPUTS]))
    with torch.no_grad():
        trainer = model.forward(inputs, response_length=6).log_probs
    plain = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    for i in range(8):
        full, without = plain_log_probs(plain, out["input_ids"][i], out["attention_mask"][i],
                                        out.non_tensors[MODEL_INPUTS][i], 6, engine.suppressed)
        torch.testing.assert_close(trainer[i][mask[i]], full, atol=1e-5, rtol=0)
        torch.testing.assert_close(out["rollout_log_probs"][i][mask[i]], without, atol=1e-5, rtol=0)
