"""`rlkit train` pre-flight loads image rows with the model's processor, as the run's dataset does: a VLM run on
the shapes task passes it (it used to fail: 'column images holds images but the model has no image processor'),
and a placeholder count the images do not match fails it naming the row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.shapes import command as shapes
from rlkit.data.schema import arrow_schema
from rlkit.errors import UserError
from rlkit.testing import save_tiny_idefics3
from rlkit.trainer.run.preflight import preflight
from rlkit.trainer.run.run_config import load_config
from tests.trainer.conftest import toy_overrides


def test_preflight_reads_images_with_the_models_processor(tmp_path):
    shapes(out=tmp_path / "shapes", questions="colour", train_size=16, test_size=4)  # one batch of 16
    model = save_tiny_idefics3(tmp_path / "vlm")
    preflight(load_config("grpo", toy_overrides(tmp_path / "shapes", model, tmp_path / "run")), allow_download=False)
    rows = pq.read_table(tmp_path / "shapes" / "train.parquet").to_pylist()
    rows[1]["prompt"][0]["content"] += " <image>"
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(images=True)), tmp_path / "shapes" / "train.parquet")
    with pytest.raises(UserError, match=r"data.train_files: .*train.parquet row 1, column 'prompt': 2 <image>"):
        preflight(load_config("grpo", toy_overrides(tmp_path / "shapes", model, tmp_path / "run")),
                  allow_download=False)
