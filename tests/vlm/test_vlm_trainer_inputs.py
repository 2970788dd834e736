"""What the trainer hands on for a vision-language run before any model runs: the rollout request carries each
row's images (without them the engine samples blind, from the image pads' embeddings: GRPO then cannot learn
to read the picture), and `rlkit train`'s pre-flight check loads image rows with the model's image processor
(it once refused every image data set) and names a bad row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.shapes import command as shapes
from data_prep.shapes import generate, make_row
from rlkit.data.dataset import RLDataset
from rlkit.data.images import ENGINE_INPUTS, MODEL_INPUTS
from rlkit.data.schema import arrow_schema
from rlkit.errors import UserError
from rlkit.models.loading import load_image_processor, load_tokenizer
from rlkit.testing import save_tiny_vlm
from rlkit.trainer.run.preflight import preflight
from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.step.rollout_source import PROMPT_KEYS, RolloutContext, repeat_with_uids
from tests.trainer.conftest import toy_overrides


@pytest.fixture(scope="module")
def vlm_and_shapes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vlm_inputs")
    shapes(out=tmp / "shapes", questions="colour", fill=True, train_size=16, test_size=4)  # one batch of 16
    return save_tiny_vlm(tmp / "vlm"), tmp / "shapes"


def test_the_rollout_request_carries_each_rows_images(vlm_and_shapes, tmp_path):
    model, data = vlm_and_shapes
    cfg = load_config("grpo", toy_overrides(data, model, tmp_path))
    prompts = RLDataset(data / "train.parquet", load_tokenizer(model), 32,
                        image_processor=load_image_processor(model)).get_batch(range(4))
    gen = repeat_with_uids(prompts, 2)
    ctx = RolloutContext(cfg, workers=None, reward_fn=None, prompts=None, step=lambda: 1, total_steps=1,
                         model_path=str(model), tokenizer=None)
    request = gen.select(ctx.rollout_keys(gen))
    assert request.keys() == [*PROMPT_KEYS, MODEL_INPUTS, ENGINE_INPUTS]
    for i in range(len(gen)):  # row i's images are the ones of the prompt it repeats
        ours, theirs = request.non_tensors[MODEL_INPUTS][i], prompts.non_tensors[MODEL_INPUTS][i // 2]
        assert ours["pixel_values"].equal(theirs["pixel_values"])
    text = gen.select(PROMPT_KEYS)
    assert ctx.rollout_keys(text) == PROMPT_KEYS


def test_preflight_loads_image_rows_and_names_a_bad_one(vlm_and_shapes, tmp_path):
    model, data = vlm_and_shapes
    preflight(load_config("grpo", toy_overrides(data, model, tmp_path / "ok")))

    rows = [make_row(r, "train", i) for i, r in enumerate(generate("train", 16, ["colour"], 0).records)]
    rows[1]["images"] = [{"bytes": b"not an image", "path": None}]
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(images=True)), tmp_path / "train.parquet")
    with pytest.raises(UserError, match=r"train.parquet row 1, column 'images' image 0: image cannot be decoded"):
        preflight(load_config("grpo", toy_overrides(tmp_path, model, tmp_path / "bad")))


def test_preflight_refuses_a_text_only_row_for_a_vlm_on_several_workers(vlm_and_shapes, tmp_path):
    """The vision tower's FSDP units gather only on ranks whose micro-batch has images: a rank with none would wait
    forever, so a multi-worker VLM run needs an image in every training row (one worker takes mixed data)."""
    model, _ = vlm_and_shapes
    rows = [make_row(r, "train", i) for i, r in enumerate(generate("train", 16, ["colour"], 0).records)]
    rows[2]["images"] = []
    for message in rows[2]["prompt"]:
        message["content"] = message["content"].replace("<image>", "")
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(images=True)), tmp_path / "train.parquet")
    preflight(load_config("grpo", toy_overrides(tmp_path, model, tmp_path / "one")))
    with pytest.raises(UserError, match=r"data.train_files: row 2 has no image.*2 workers.*n_gpus_per_node=1"):
        preflight(load_config("grpo", [*toy_overrides(tmp_path, model, tmp_path / "two"),
                                       "trainer.n_gpus_per_node=2"]))


def test_preflight_refuses_images_with_a_multi_turn_rollout(vlm_and_shapes, tmp_path):
    """The agent loop hands the engine token ids alone: it would generate without the pictures, so it is refused."""
    model, data = vlm_and_shapes
    with pytest.raises(UserError, match=r"data.train_files: images with rollout.multi_turn.enable=true.*"
                                        r"multi_turn.enable=false"):
        preflight(load_config("grpo", [*toy_overrides(data, model, tmp_path),
                                       "actor_rollout_ref.rollout.multi_turn.enable=true"]))
