"""`rlkit eval`: aggregation by hand, and a real run of a tiny model on a handmade parquet."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlkit.eval.evaluator import aggregate
from rlkit_cli.main import app


def row(prompt: int, score: float, pred: str | None, ds: str = "openai/gsm8k", length: int = 10) -> dict:
    extras = {"acc": float(score >= 1.0)}
    if pred is not None:
        extras["pred"] = pred
    return {"prompt_index": prompt, "data_source": ds, "score": score, "extras": extras, "response_length": length}


def test_aggregate_by_hand():
    rows = [
        # prompt 0: answers 5 (right), 7, 7 -> mean 1/3, maj wrong (7), pass 1
        row(0, 1.0, "5"), row(0, 0.0, "7"), row(0, 0.0, "7"),
        # prompt 1: 3 (right) twice, 4 once -> mean 2/3, maj right, pass 1
        row(1, 1.0, "3", length=20), row(1, 1.0, "3"), row(1, 0.0, "4"),
        # prompt 2: all wrong -> mean 0, maj wrong, pass 0
        row(2, 0.0, "1"), row(2, 0.0, "2"), row(2, 0.0, "2"),
    ]
    m = aggregate(rows, 3)["openai/gsm8k"]
    assert m["prompts"] == 3
    assert m["score/mean@3"] == m["acc/mean@3"] == pytest.approx((1 / 3 + 2 / 3 + 0) / 3)
    assert m["acc/maj@3"] == pytest.approx(1 / 3)
    assert m["acc/pass@3"] == m["score/best@3"] == pytest.approx(2 / 3)
    assert m["response_length/mean"] == pytest.approx((10 * 8 + 20) / 9)
    assert m["response_length/max"] == 20


def test_aggregate_partial_credit_without_pred():
    rows = [row(0, 0.5, None, ds="rlkit/toy_copy"), row(0, 1.0, None, ds="rlkit/toy_copy")]
    m = aggregate(rows, 2)["rlkit/toy_copy"]
    assert m["score/mean@2"] == 0.75 and m["acc/pass@2"] == 1.0 and "acc/maj@2" not in m


def test_eval_cli_on_tiny_model(tmp_path):
    from rlkit.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "model", tie_embeddings=True)
    runner = CliRunner()
    res = runner.invoke(app, ["data", "toy", "--out", str(tmp_path / "toy"), "--length", "1", "--test-size", "6"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "gen.jsonl"
    res = runner.invoke(app, [
        "eval", str(model), "--data", str(tmp_path / "toy" / "test.parquet"), "--n", "2", "--limit", "4",
        "--backend", "hf", "--max-response-length", "3", "--out", str(out),
    ])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and {r["prompt_index"] for r in rows} == {0, 1, 2, 3}
    expected = aggregate(rows, 2)["rlkit/toy_copy"]
    assert "rlkit/toy_copy" in res.output and f"{expected['score/mean@2']:.3f}" in res.output
    # scores are the toy_copy scorer's, recomputed from the saved text
    from rlkit.reward.toy_copy import toy_copy_score

    for r in rows:
        assert r["score"] == pytest.approx(toy_copy_score(r["response"], r["ground_truth"])["score"])


def test_eval_missing_data_is_a_clear_error(tmp_path):
    from rlkit.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    res = CliRunner().invoke(app, ["eval", str(model), "--data", str(tmp_path / "nope.parquet"), "--backend", "hf"])
    assert res.exit_code == 1 and "nope.parquet" in res.output


def test_multi_turn_eval_runs_the_agent_loop(tmp_path):
    """--tools wraps the engine in the agent loop, as training's multi_turn does: rows say how each episode went."""
    from rlkit.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "model", tie_embeddings=True)
    runner = CliRunner()
    res = runner.invoke(app, ["data", "toy", "--out", str(tmp_path / "toy"), "--length", "1", "--test-size", "4"])
    assert res.exit_code == 0, res.output
    data, out = tmp_path / "toy" / "test.parquet", tmp_path / "gen.jsonl"
    res = runner.invoke(app, [
        "eval", str(model), "--data", str(data), "--limit", "3", "--backend", "hf", "--max-response-length", "8",
        "--max-prompt-length", "200", "--tools", "calculator,notepad", "--max-turns", "2",
        "--interaction", "fixed_reply", "--out", str(out),
    ])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3
    for r in rows:
        assert 1 <= r["num_turns"] <= 2 and r["finish"] in ("stop", "max_turns", "length") and r["tool_calls"] >= 0
    assert "num_turns/mean" in res.output, res.output

    bad = runner.invoke(app, ["eval", str(model), "--data", str(data), "--backend", "hf", "--tools", "calculater"])
    assert bad.exit_code == 1 and "--tools: 'calculater' is not registered" in bad.output
    alone = runner.invoke(app, ["eval", str(model), "--data", str(data), "--interaction", "fixed_reply"])
    assert alone.exit_code == 1 and "--interaction needs --tools" in alone.output
