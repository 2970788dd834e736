"""`rlkit generate`, verl's main_generation in its keys: N responses per prompt of a parquet into a parquet with verl's
layout (the input rows and a `responses` column of N strings each), on a tiny model with the hf backend."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlkit.errors import UserError
from rlkit.eval.generate import load_job
from rlkit_cli.main import app

PROMPTS = ["copy the digits : 1 2", "copy the digits : 3", "reverse 4 5", "copy the digits : 6 7 8", "answer"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlkit.testing import save_tiny_model

    out = tmp_path_factory.mktemp("gen")
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": p}], "data_source": "toy",
                                          "extra": i} for i, p in enumerate(PROMPTS)]), out / "test.parquet")
    return save_tiny_model(out / "tiny"), out


def keys(out, model, n, name, **more) -> list[str]:
    values = {"data.path": out / "test.parquet", "data.n_samples": n, "data.output_path": out / name,
              "data.batch_size": 2, "model.path": model, "rollout.name": "hf", "rollout.response_length": 6,
              "rollout.prompt_length": 64, **more}
    return [f"{k}={v}" for k, v in values.items()]


def test_generates_n_responses_per_prompt_in_verls_layout(tiny):
    model, out = tiny
    res = CliRunner().invoke(app, ["generate", *keys(out, model, 3, "gen.parquet"), "trainer.n_gpus_per_node=8",
                                   "ray_kwargs.ray_init.num_cpus=null"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "ray_kwargs.*, trainer.*: nothing to set" in " ".join(res.output.split())
    table = pq.read_table(out / "gen.parquet")
    assert table.column_names == ["prompt", "data_source", "extra", "responses"]
    assert table.schema.field("responses").type == pa.list_(pa.string())
    rows = table.to_pylist()
    assert [r["extra"] for r in rows] == list(range(len(PROMPTS)))  # the input rows, in order
    assert all(len(r["responses"]) == 3 and all(isinstance(x, str) for x in r["responses"]) for r in rows)
    assert any(x for r in rows for x in r["responses"])  # something was generated

    # greedy: the same responses again, whatever the batch
    for name, batch in (("g1.parquet", 2), ("g2.parquet", 5)):
        res = CliRunner().invoke(app, ["generate", *keys(out, model, 1, name, **{"rollout.temperature": 0,
                                                                                  "data.batch_size": batch})])
        assert res.exit_code == 0, res.output
    first, second = (pq.read_table(out / n).column("responses").to_pylist() for n in ("g1.parquet", "g2.parquet"))
    assert first == second and all(len(x) == 1 for x in first)


def test_bad_keys_are_one_line(tiny, tmp_path):
    model, out = tiny
    with pytest.raises(UserError, match=r"unknown key 'data.n_sample' for rlkit generate; closest: data.n_samples"):
        load_job([*keys(out, model, 2, "x.parquet"), "data.n_sample=3"])
    with pytest.raises(UserError, match="data.output_path is not set"):
        load_job([f"model.path={model}"])
    res = CliRunner().invoke(app, ["generate", *keys(out, model, 4, "x.parquet", **{"rollout.temperature": 0})])
    assert res.exit_code == 1 and "every one of data.n_samples=4 responses would be the same" in res.output
    res = CliRunner().invoke(app, ["generate", *keys(out, model, 1, "x.parquet", **{"data.prompt_key": "question"})])
    assert res.exit_code == 1 and "no column 'question'" in res.output and "set data.prompt_key" in res.output
    res = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "Example:" in res.output and "verl.trainer.main_generation" in res.output
