"""`rlkit data gsm8k`: row counts, every ground truth, exact types, the offline copy, the hub fallback."""

from __future__ import annotations

import importlib.machinery
import json
import re
import sys
import time
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep import gsm8k, sources
from rlkit.data.schema import validate_table

EXPECTED_ROWS = {"train": 7473, "test": 1319}


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def from_source(tmp_path_factory, cli, gsm8k_source) -> Path:
    out = tmp_path_factory.mktemp("gsm8k_source")
    result = cli("data", "gsm8k", "--source", gsm8k_source, "--out", out)
    assert result.exit_code == 0, result.output
    assert f"--source {gsm8k_source}" in flat(result.output)
    return out


@pytest.fixture(scope="module")
def from_package(tmp_path_factory, cli) -> Path:
    out = tmp_path_factory.mktemp("gsm8k_packaged")
    result = cli("data", "gsm8k", "--no-hub", "--out", out)
    assert result.exit_code == 0, result.output
    assert "packaged copy" in flat(result.output)
    return out


@pytest.mark.parametrize("split", ["train", "test"])
def test_rows_ground_truth_and_indices(from_source, gsm8k_source, split):
    table = pq.read_table(from_source / f"{split}.parquet")
    assert table.num_rows == EXPECTED_ROWS[split]
    raw = [json.loads(line) for line in (gsm8k_source / f"{split}.jsonl").read_text().splitlines() if line.strip()]
    rows = table.to_pylist()
    for i, (row, record) in enumerate(zip(rows, raw, strict=True)):
        number = re.search(r"####\s*(.+?)\s*$", record["answer"]).group(1).replace(",", "")
        assert re.fullmatch(r"-?\d+(\.\d+)?", number), record["answer"]
        assert row["reward_model"] == {"style": "rule", "ground_truth": number}
        assert row["extra_info"] == {
            "split": split,
            "index": i,
            "answer": record["answer"],
            "question": record["question"],
        }
        assert row["prompt"] == [{"role": "user", "content": f"{record['question']} {gsm8k.INSTRUCTION}"}]
        assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert any("," in r["answer"].split("####")[-1] for r in raw)  # the comma case is really covered


def test_schema_types_are_exact(from_source):
    schema = pq.read_schema(from_source / "train.parquet")
    string = pa.string()
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert schema.field("data_source").type == string
    assert schema.field("ability").type == string
    assert schema.field("prompt").type == pa.list_(pa.struct([("role", string), ("content", string)]))
    assert schema.field("reward_model").type == pa.struct([("style", string), ("ground_truth", string)])
    assert schema.field("extra_info").type == pa.struct(
        [("split", string), ("index", pa.int64()), ("answer", string), ("question", string)]
    )
    assert validate_table(pq.read_table(from_source / "train.parquet")) == []


@pytest.mark.parametrize("split", ["train", "test"])
def test_packaged_copy_gives_the_same_parquet(from_source, from_package, split):
    a = pq.read_table(from_source / f"{split}.parquet")
    b = pq.read_table(from_package / f"{split}.parquet")
    assert a.schema == b.schema
    assert a.equals(b)


def test_packaged_copy_keeps_its_licence():
    assets = sources.packaged_dir("gsm8k")
    assert "MIT License" in (assets / "LICENSE").read_text()
    assert {p.name for p in assets.iterdir()} >= {"train.jsonl", "test.jsonl", "LICENSE", "README.md"}


def test_limit_and_force(cli, gsm8k_source, tmp_path):
    result = cli("data", "gsm8k", "--source", gsm8k_source, "--out", tmp_path, "--limit", 5)
    assert result.exit_code == 0, result.output
    assert {s: pq.read_metadata(tmp_path / f"{s}.parquet").num_rows for s in ("train", "test")} == {
        "train": 5,
        "test": 5,
    }
    before = (tmp_path / "train.parquet").stat().st_mtime_ns
    refused = cli("data", "gsm8k", "--source", gsm8k_source, "--out", tmp_path, "--limit", 3)
    assert refused.exit_code == 1
    assert "already exist" in flat(refused.output) and "--force" in refused.output
    assert "Traceback" not in refused.output
    assert (tmp_path / "train.parquet").stat().st_mtime_ns == before
    forced = cli("data", "gsm8k", "--source", gsm8k_source, "--out", tmp_path, "--limit", 3, "--force")
    assert forced.exit_code == 0, forced.output
    assert pq.read_metadata(tmp_path / "train.parquet").num_rows == 3


def test_single_file_source_and_split(cli, gsm8k_source, tmp_path):
    result = cli("data", "gsm8k", "--source", gsm8k_source / "test.jsonl", "--out", tmp_path / "a", "--limit", 2)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["test.parquet"]
    result = cli("data", "gsm8k", "--source", gsm8k_source / "test.jsonl", "--split", "train", "--out", tmp_path / "b")
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "b" / "train.parquet").column("extra_info")[0].as_py()["split"] == "train"


def test_parquet_source(cli, from_source, tmp_path):
    """A parquet with the original columns (e.g. the hub's shard files) works as --source too."""
    table = pq.read_table(from_source / "test.parquet").slice(0, 10).to_pylist()
    rows = [{"question": r["extra_info"]["question"], "answer": r["extra_info"]["answer"]} for r in table]
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), src / "test-00000-of-00001.parquet")
    result = cli("data", "gsm8k", "--source", src, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "out" / "test.parquet").equals(pq.read_table(from_source / "test.parquet")[:10])


@pytest.mark.parametrize(
    "line, expected",
    [
        ('{"question": "q", "answer": "no final line"}', "line 2: answer has no '#### N'"),
        ('{"question": "q", "answer": "x\\n####   "}', "line 2: nothing follows '####'"),
        ('{"question": "q"}', "line 2: field 'answer' is missing"),
        ("{not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
    ],
)
def test_bad_source_rows_name_file_and_line(cli, tmp_path, line, expected):
    src = tmp_path / "train.jsonl"
    src.write_text('{"question": "ok", "answer": "1\\n#### 1"}\n' + line + "\n")
    result = cli("data", "gsm8k", "--source", src, "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert f"{src} {expected}" in flat(result.output)
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "train.parquet").exists()


def test_bad_source_paths(cli, tmp_path):
    missing = cli("data", "gsm8k", "--source", tmp_path / "nope", "--out", tmp_path / "o")
    assert missing.exit_code == 1 and "no such file or directory" in flat(missing.output)
    (tmp_path / "empty").mkdir()
    empty_dir = cli("data", "gsm8k", "--source", tmp_path / "empty", "--out", tmp_path / "o")
    assert empty_dir.exit_code == 1 and "no split files found" in flat(empty_dir.output)
    (tmp_path / "train.csv").write_text("a,b\n")
    csv = cli("data", "gsm8k", "--source", tmp_path / "train.csv", "--out", tmp_path / "o")
    assert csv.exit_code == 1 and "unsupported source format '.csv'" in flat(csv.output)
    (tmp_path / "train.jsonl").write_text("\n")
    blank = cli("data", "gsm8k", "--source", tmp_path / "train.jsonl", "--out", tmp_path / "o")
    assert blank.exit_code == 1 and "has no records" in flat(blank.output)


# ---------------------------------------------------------------- the hub path, with a fake `datasets`
class _FakeSplit:
    def __init__(self, rows):
        self.rows = rows

    def to_list(self):
        return self.rows


@pytest.fixture
def fake_datasets(monkeypatch):
    """A stand-in `datasets` module; the hub counts as reachable. Tests set `load_dataset`."""
    module = types.ModuleType("datasets")
    module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    monkeypatch.setitem(sys.modules, "datasets", module)
    monkeypatch.setattr(sources, "hub_offline", lambda: False)
    monkeypatch.setattr(sources, "hub_reachable", lambda: True)
    return module


def test_hub_is_used_when_available(fake_datasets, cli, tmp_path):
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        return _FakeSplit([{"question": f"{split} q", "answer": "step\n#### 1,234"}])

    fake_datasets.load_dataset = load_dataset
    result = cli("data", "gsm8k", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert "hub openai/gsm8k (main)" in flat(result.output)
    row = pq.read_table(tmp_path / "test.parquet").to_pylist()[0]
    assert row["reward_model"]["ground_truth"] == "1234" and row["extra_info"]["question"] == "test q"


def test_hub_failure_falls_back_to_the_packaged_copy(fake_datasets, cli, tmp_path):
    def load_dataset(*args, **kwargs):
        raise ConnectionError("boom")

    fake_datasets.load_dataset = load_dataset
    result = cli("data", "gsm8k", "--out", tmp_path, "--limit", 1)
    assert result.exit_code == 0, result.output
    assert "packaged copy" in flat(result.output) and "ConnectionError: boom" in flat(result.output)


def test_a_hanging_hub_times_out(fake_datasets):
    fake_datasets.load_dataset = lambda *a, **k: time.sleep(30)
    start = time.monotonic()
    got, why = sources.load_hub(gsm8k.HUB, timeout=0.3)
    assert got is None and "did not answer" in why
    assert time.monotonic() - start < 5


def test_hub_skipped_without_datasets_or_when_offline(monkeypatch):
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    assert "not installed" in sources.hub_unavailable_reason()
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert "offline" in sources.hub_unavailable_reason()
