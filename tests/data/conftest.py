"""Fixtures for the data tests: the tiny tokenizer, a CLI runner, and a parquet writer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from data_prep.sources import packaged_dir

SHARED_GSM8K = Path("/work/shared/data/gsm8k")


@pytest.fixture(scope="session")
def gsm8k_source() -> Path:
    """The original GSM8K release: the shared copy when present, else the identical packaged one."""
    return SHARED_GSM8K if (SHARED_GSM8K / "train.jsonl").exists() else packaged_dir("gsm8k")


@pytest.fixture(scope="session")
def tokenizer():
    from rlkit.testing import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def cli() -> Callable[..., Any]:
    """`cli("data", "toy", ...)` runs the real Typer app and returns the click Result."""
    from rlkit_cli.main import app

    runner = CliRunner()

    def invoke(*args: Any):
        return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})

    return invoke


def toy_row(i: int, digits: str = "1 2 3", **overrides: Any) -> dict[str, Any]:
    row = {
        "data_source": "rlkit/toy_copy",
        "prompt": [{"role": "user", "content": f"copy the digits : {digits}"}],
        "ability": "toy",
        "reward_model": {"style": "rule", "ground_truth": digits},
        "extra_info": {"split": "train", "index": i},
    }
    row.update(overrides)
    return row


@pytest.fixture
def write_parquet(tmp_path: Path) -> Callable[..., Path]:
    """`write_parquet(rows, name="x.parquet", schema=None)` -> path (types inferred unless given)."""

    def write(rows: list[dict[str, Any]], name: str = "data.parquet", schema: pa.Schema | None = None) -> Path:
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        return path

    return write
