"""`rlkit data pairs`: scored generations -> best/worst preference pairs, checked by `rlkit data inspect`."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from data_prep.pairs import best_worst_pairs
from rlkit.data.preference import PreferenceDataset

PROMPT = [{"role": "user", "content": "copy the digits : 1 2"}]


def gen(index: int, response: str, score: float) -> dict:
    return {"prompt_index": index, "data_source": "rlkit/toy_copy", "prompt": PROMPT, "response": response,
            "ground_truth": "1 2", "score": score, "extras": {}}


def test_best_and_worst_per_prompt_ties_give_no_pair():
    rows = [gen(0, "1 3", 0.5), gen(0, "1 2", 1.0), gen(0, "9 9", 0.0), gen(0, "2 2", 0.0),
            gen(1, "1 2", 1.0), gen(1, "1 2 .", 1.0),  # all equal: nothing to prefer
            gen(2, "1", 0.5), gen(2, "", 1.0), gen(2, "3 3", 0.0)]  # the empty reply takes no part
    pairs = best_worst_pairs(rows)
    assert [(p["extra_info"]["prompt_index"], p["chosen"], p["rejected"]) for p in pairs] == [
        (0, "1 2", "9 9"), (2, "1", "3 3")]  # the first of equal worsts
    assert pairs[0]["chosen_score"] == 1.0 and pairs[0]["rejected_score"] == 0.0
    assert best_worst_pairs(rows, min_margin=0.5) == pairs[:1]


def test_reward_rescores_and_bad_lines_name_the_line(cli, tmp_path):
    path = tmp_path / "gen.jsonl"
    rows = [gen(0, "1 2", 0.0), gen(0, "2 1", 0.0)]  # eval's scores tie; the toy_copy scorer tells them apart
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "0 of 1 prompts" in " ".join(cli("data", "pairs", path).output.split())
    result = cli("data", "pairs", path, "--reward", "toy_copy", "--out", tmp_path / "pairs")
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "pairs" / "train.parquet").to_pylist()
    assert [(r["chosen"], r["rejected"]) for r in table] == [("1 2", "2 1")]

    path.write_text(json.dumps(gen(0, "1", 1.0)) + "\n" + json.dumps({"prompt_index": 0, "score": 1.0}) + "\n")
    result = cli("data", "pairs", path, "--force")
    assert result.exit_code == 1 and f"{path} line 2: no prompt, response" in " ".join(result.output.split())


def test_eval_output_to_pairs_to_inspect(cli, tmp_path, tokenizer):
    """A real eval of a tiny random model, sampled 12 times per prompt, becomes a pair file inspect accepts."""
    from rlkit.testing import save_tiny_model

    model = save_tiny_model(tmp_path / "model", tie_embeddings=True)
    assert cli("data", "toy", "--out", tmp_path / "toy", "--length", 1, "--test-size", 24).exit_code == 0
    generations = tmp_path / "gen.jsonl"
    result = cli("eval", model, "--data", tmp_path / "toy" / "test.parquet", "--n", 12, "--temperature", 1.0,
                 "--backend", "hf", "--max-response-length", 4, "--out", generations)
    assert result.exit_code == 0, result.output
    result = cli("data", "pairs", generations, "--test-size", 1)
    assert result.exit_code == 0, result.output
    train, test = tmp_path / "pairs" / "train.parquet", tmp_path / "pairs" / "test.parquet"
    pairs = pq.read_table(train).to_pylist()
    assert len(pairs) >= 2 and len(pq.read_table(test).to_pylist()) == 1
    scored = [json.loads(line) for line in generations.read_text().splitlines()]
    for pair in pairs:  # the best and the worst of the prompt's own samples
        mine = [r for r in scored if r["prompt_index"] == pair["extra_info"]["prompt_index"] and r["response"].strip()]
        assert pair["chosen_score"] == max(r["score"] for r in mine) > pair["rejected_score"]
        assert pair["rejected_score"] == min(r["score"] for r in mine)
        assert pair["prompt"] == mine[0]["prompt"]
    result = cli("data", "inspect", train, "-n", 1)
    out = " ".join(result.output.split())
    assert result.exit_code == 0 and f"valid: {len(pairs)} rows" in out and "chosen" in out, result.output
    assert len(PreferenceDataset([train, test], tokenizer)) == len(pairs) + 1  # and it loads for DPO


def test_inspect_lists_every_bad_pair(cli, write_parquet):
    path = write_parquet([{"prompt": "what ?", "chosen": "5", "rejected": ""},
                          {"prompt": "what ?", "chosen": " ", "rejected": "6"}])
    result = cli("data", "inspect", path)
    out = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "row 0, column 'rejected': is empty" in out and "row 1, column 'chosen': is empty" in out
