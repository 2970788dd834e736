"""Images in the RL dataset (verl's `images` column + `<image>` placeholders), `rlkit data shapes`, the scorer."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from data_prep.shapes import generate, make_row
from rlkit.data.dataset import RLDataset
from rlkit.data.schema import arrow_schema
from rlkit.errors import UserError
from rlkit.reward.shapes import shapes_score
from rlkit.testing import build_tiny_vlm_processor


def png(width: int, height: int, colour=(255, 0, 0)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, format="PNG")
    return out.getvalue()


def row(content: str, images: list) -> dict:
    return {"data_source": "rlkit/shapes", "prompt": [{"role": "user", "content": content}], "ability": "vision",
            "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"split": "train", "index": 0},
            "images": images}


def write(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(images=True)), path)
    return str(path)


@pytest.fixture(scope="module")
def processor():
    return build_tiny_vlm_processor()


def load(path, processor) -> RLDataset:
    tokenizer, images = processor
    return RLDataset(path, tokenizer, max_prompt_length=128, image_processor=images)


def test_rows_carry_images_and_widened_pads(tmp_path, processor):
    (tmp_path / "pic.png").write_bytes(png(56, 56, (0, 0, 255)))
    path = write(tmp_path / "d.parquet", [
        row("how many shapes ?", []),
        row("<image> how many shapes ?", [{"bytes": png(56, 56), "path": None}]),
        row("<image> left or <image> right ?",
            [{"bytes": png(112, 56), "path": None}, {"bytes": None, "path": "pic.png"}]),
    ])
    ds = load(path, processor)
    tokenizer, _ = processor
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    counts = [int((r["input_ids"] == pad).sum()) for r in (ds[0], ds[1], ds[2])]
    assert counts == [0, 4, 8 + 4]  # 56x56 -> 4x4 patches -> 2x2 merged; 112x56 -> 8x4 -> 4x2
    assert ds[0]["multi_modal_inputs"] == {} and ds[0]["multi_modal_data"] == {}
    grid = ds[2]["multi_modal_inputs"]["image_grid_thw"].tolist()
    assert grid == [[1, 4, 8], [1, 4, 4]]
    assert ds[2]["multi_modal_inputs"]["pixel_values"].shape[0] == 32 + 16
    assert [im.size for im in ds[2]["multi_modal_data"]["image"]] == [(112, 56), (56, 56)]
    assert "images" not in ds.columns
    batch = ds.get_batch([0, 1, 2])
    assert len(batch.non_tensors["multi_modal_inputs"]) == 3


@pytest.mark.parametrize("content, images, message", [
    ("<image> <image> what ?", [{"bytes": png(56, 56), "path": None}], "2 <image> placeholders in the prompt but 1"),
    ("<image> what ?", [{"bytes": None, "path": "missing.png"}], "missing.png not found"),
    ("<image> what ?", [{"bytes": b"not an image", "path": None}], "cannot be decoded"),
])
def test_bad_rows_fail_naming_the_row(tmp_path, processor, content, images, message):
    path = write(tmp_path / "bad.parquet", [row("<image> fine", [{"bytes": png(56, 56), "path": None}]),
                                            row(content, images)])
    with pytest.raises(UserError, match=message) as err:
        load(path, processor)
    assert "row 1" in str(err.value) and "\n" not in str(err.value)


def test_shapes_rows_load_and_the_scorer_needs_the_answer(tmp_path, processor):
    records = generate("train", 12, ["count", "colour", "position"], seed=0)
    rows = [make_row(r, "train", i) for i, r in enumerate(records.records)]
    ds = load(write(tmp_path / "s.parquet", rows), processor)
    assert len(ds) == 12
    answers = {r["reward_model"]["ground_truth"] for r in rows}
    assert answers & {"1", "2", "3"} and answers & {"red", "green", "blue", "yellow"} and answers & {"left", "right"}
    tokenizer, _ = processor
    assert tokenizer.unk_token_id not in ds[0]["input_ids"].tolist()
    assert shapes_score("red <|im_end|>", "red") == 1.0
    assert shapes_score("blue red", "red") == 0.0
    assert shapes_score("", "red") == 0.0


def test_geo3k_converts_a_local_copy_in_the_published_layout(tmp_path, processor):
    from data_prep.geo3k import command

    (tmp_path / "src" / "data").mkdir(parents=True)
    shard = [{"images": [{"bytes": png(64, 48), "path": "f.png"}], "problem": "<image>Find x.", "answer": "3"}]
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(shard), tmp_path / "src" / "data" / f"{split}-00000-of-00001.parquet")
    command(source=tmp_path / "src", out=tmp_path / "out")
    ds = load(tmp_path / "out" / "train.parquet", processor)
    row = ds[0]
    assert row["data_source"] == "hiyouga/geometry3k" and row["reward_model"]["ground_truth"] == "3"
    assert row["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]  # 64x48 -> 56x56 (min_pixels)
    with pytest.raises(UserError, match="--source"):
        command(source=None, out=tmp_path / "none")


def test_shapes_fill_shows_the_colour_in_every_image_token_and_fits_colour_questions_only(tmp_path):
    import numpy as np
    import typer

    from data_prep.shapes import COLOURS
    from data_prep.shapes import command as shapes

    for record in generate("train", 8, ["colour"], seed=0, fill=True).records:
        pixels = np.asarray(Image.open(io.BytesIO(make_row(record, "train", 0)["images"][0]["bytes"])))
        colour = np.array(COLOURS[record["answer"]])
        for qy in (0, 28):  # each 28x28 quadrant is one image token after the 2x2 merge of 14-px patches
            for qx in (0, 28):
                quadrant = pixels[qy:qy + 28, qx:qx + 28].reshape(-1, 3)
                assert (quadrant == colour).all(-1).mean() > 0.15, (record, qy, qx)  # a triangle: ~0.23
    with pytest.raises(typer.BadParameter, match="--questions colour only"):
        shapes(out=tmp_path / "s", questions="count,colour", fill=True, train_size=2, test_size=2)
