"""`rlkit reward score --reward-model PATH` (and the judge options) score rows beside the rule scores."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from rlkit.testing import build_tiny_tokenizer
from rlkit_cli.main import app
from tests.reward.rm_helpers import plain_scores, save_rm
from tests.reward.test_reward_mix import VerdictServer

ROWS = [
    {"data_source": "rlkit/toy_copy", "prompt": "copy the digits : 7", "response": "7", "ground_truth": "7"},
    {
        "data_source": "rlkit/toy_copy",
        "prompt": [{"role": "user", "content": "copy the digits : 1 2"}],
        "response": "1 3",
        "ground_truth": "1 2",
    },
    {"data_source": "rlkit/toy_copy", "prompt": "copy the digits : 8", "response": "8", "ground_truth": "8"},
]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_reward_model_and_judge_scores_beside_rule_scores(tmp_path):
    rm = save_rm(tmp_path / "rm")
    rows = write(tmp_path / "rows.jsonl", ROWS)
    template = tmp_path / "judge.txt"
    template.write_text("PROMPT: {prompt} RESPONSE: {response}")
    server = VerdictServer()
    try:
        res = CliRunner().invoke(
            app,
            [
                "reward",
                "score",
                str(rows),
                "--out",
                str(tmp_path / "out.jsonl"),
                "--reward-model",
                str(rm),
                "--judge-url",
                server.url,
                "--judge-model",
                "j",
                "--judge-template",
                str(template),
                "--judge-timeout",
                "5",
            ],
        )
    finally:
        server.close()
    assert res.exit_code == 0, res.output
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["score"] for r in out] == [1.0, 0.5, 1.0]
    tok = build_tiny_tokenizer()
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": "copy the digits : 7"}, {"role": "assistant", "content": "7"}], tokenize=False
        ),
        tok.apply_chat_template([*ROWS[1]["prompt"], {"role": "assistant", "content": "1 3"}], tokenize=False),
        tok.apply_chat_template(
            [{"role": "user", "content": "copy the digits : 8"}, {"role": "assistant", "content": "8"}], tokenize=False
        ),
    ]
    want = plain_scores(rm, [tok(t, add_special_tokens=False)["input_ids"] for t in texts])
    assert torch.allclose(torch.tensor([r["rm_score"] for r in out]), want, atol=1e-5)
    # the test server: "7" -> Score: 10, "8" -> 500 on every try
    assert [r["judge_score"] for r in out] == [1.0, 0.0, 0.0]
    assert "judge_error" in out[2] and "judge_error" not in out[0]
    table = res.output.replace("\n", " ")
    assert f"{float(want.mean()):.4f}" in table and "judge" in table  # the mean RM score beside the rule score


def test_reward_model_needs_a_prompt(tmp_path):
    rm = save_rm(tmp_path / "rm")
    rows = write(tmp_path / "rows.jsonl", [{k: v for k, v in ROWS[0].items() if k != "prompt"}])
    res = CliRunner().invoke(app, ["reward", "score", str(rows), "--reward-model", str(rm)])
    assert res.exit_code == 1
    assert "row 1: --reward-model needs a 'prompt'" in res.output and "Traceback" not in res.output


def test_help_shows_the_reward_model_example():
    res = CliRunner().invoke(app, ["reward", "score", "--help"], terminal_width=200)
    assert res.exit_code == 0
    assert "--reward-model" in res.output and "rlkit reward score chats.jsonl --reward-model" in res.output
