"""The HF rollout generates from prompts with images (the rows' processor output), and the trainer's log-probs of
what it sampled equal the engine's (float32), rows with and without images in one batch."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from data_prep.shapes import generate, make_row
from rlkit.config.rollout import RolloutConfig
from rlkit.config.schema import FSDPConfig
from rlkit.data.dataset import RLDataset
from rlkit.data.images import MODEL_INPUTS
from rlkit.data.schema import arrow_schema
from rlkit.models.loading import load_image_processor, load_tokenizer
from rlkit.rollout.hf_rollout import HFRollout
from rlkit.testing import save_tiny_vlm
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.model_inputs import ModelInputs


def test_hf_rollout_with_images_matches_the_trainer(tmp_path):
    path = save_tiny_vlm(tmp_path / "tiny")
    rows = [make_row(r, "train", i) for i, r in enumerate(generate("train", 4, ["count", "colour"], 0).records)]
    rows[3] = {**rows[3], "prompt": [{"role": "user", "content": "what colour is the shape ?"}], "images": []}
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(images=True)), tmp_path / "d.parquet")
    tokenizer = load_tokenizer(path)
    data = RLDataset(tmp_path / "d.parquet", tokenizer, 64, image_processor=load_image_processor(path))
    prompts = data.get_batch(range(4)).repeat(2)
    config = RolloutConfig(name="hf", response_length=6, temperature=1.0, calculate_log_probs=True, max_num_seqs=4,
                           seed=3)
    out = HFRollout(path, config).generate(prompts, config.to_sampling())
    assert out["response_mask"].sum() > 8 and len(out.non_tensors[MODEL_INPUTS]) == 8

    model = FSDPModel(str(path), FSDPConfig(), torch.device("cpu"))
    inputs = ModelInputs.of(out["input_ids"], out["attention_mask"], out["position_ids"])
    inputs = inputs.with_images(model.module, list(out.non_tensors[MODEL_INPUTS]))
    with torch.no_grad():
        lp = model.forward(inputs, response_length=6).log_probs
    mask = out["response_mask"].bool()
    torch.testing.assert_close(lp[mask], out["rollout_log_probs"][mask], atol=1e-5, rtol=0)
