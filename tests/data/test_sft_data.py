"""The SFT loss mask covers the assistant turns only, per turn, as the full rendering holds them (rlkit.data.chat_mask),
and bad SFT files fail with one line naming the row or the key."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.config.sft_schema import SFTDataConfig
from rlkit.data.chat_mask import render_conversation
from rlkit.data.sft_dataset import SFTDataset
from rlkit.errors import UserError
from rlkit.testing import DIGITS, WORDS, build_tiny_tokenizer

# drops the reasoning of every assistant turn but the last, as Qwen3's template does
STRIP_THINKING = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|> assistant ' + message['content'].split('</think>')[-1] + ' <|im_end|> ' }}"
    "{% else %}{{ '<|im_start|> ' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|> assistant ' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "copy the digits"},
    {"role": "user", "content": "copy 1 2"},
    {"role": "assistant", "content": "<think> step </think> 1 2"},
    {"role": "user", "content": "reverse 1 2"},
    {"role": "assistant", "content": "<think> step </think> 2 1"},
    {"role": "user", "content": "answer"},
]


def trained(tok, messages) -> list[str]:
    r = render_conversation(tok, messages)
    return [tok.convert_ids_to_tokens(int(i)) for i, m in zip(r.input_ids, r.loss_mask) if m]


def test_mask_covers_each_assistant_turn_and_its_end_marker_only():
    tok = build_tiny_tokenizer(words=WORDS + DIGITS + ["<think>", "</think>"])
    assert trained(tok, CONVERSATION) == [
        "<think>", "step", "</think>", "1", "2", "<|im_end|>",
        "<think>", "step", "</think>", "2", "1", "<|im_end|>",
    ]


def test_mask_follows_a_template_that_rewrites_earlier_turns():
    tok = build_tiny_tokenizer(words=WORDS + DIGITS + ["<think>", "</think>"], chat_template=STRIP_THINKING)
    # the full rendering keeps no reasoning of the first answer (a user turn follows both); the last
    # message is the assistant's own when it ends the conversation
    assert trained(tok, CONVERSATION) == ["1", "2", "<|im_end|>", "2", "1", "<|im_end|>"]
    assert trained(tok, CONVERSATION[:-1]) == ["1", "2", "<|im_end|>", "<think>", "step", "</think>", "2", "1",
                                               "<|im_end|>"]


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_single_turn_columns_and_bad_rows(tmp_path):
    tok = build_tiny_tokenizer()
    data = SFTDataConfig(max_length=64)
    single = write(tmp_path / "single.parquet", [{"prompt": "copy 3 4", "response": "3 4"}])
    ds = SFTDataset(single, tok, data)
    batch = ds.get_batch([0])
    targets = batch["responses"][0][batch["response_mask"][0].bool()]
    assert tok.convert_ids_to_tokens(targets.tolist()) == ["3", "4", "<|im_end|>"]

    no_answer = write(tmp_path / "no_answer.parquet", [
        {"messages": [{"role": "user", "content": "copy 1"}, {"role": "assistant", "content": "1"}]},
        {"messages": [{"role": "user", "content": "copy 2"}, {"role": "user", "content": "2"}]},
    ])
    with pytest.raises(UserError, match=r"no_answer.parquet row 1: .* no assistant turn"):
        SFTDataset(no_answer, tok, data)
    with pytest.raises(UserError, match=r"no data.messages_key column 'conversation'.*data.messages_key=<column>"):
        SFTDataset(no_answer, tok, SFTDataConfig(messages_key="conversation"))
    with pytest.raises(UserError, match=r"row 0: \d+ tokens > data.max_length=4"):
        SFTDataset(no_answer, tok, SFTDataConfig(max_length=4))


def cli(*args):
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_data_messages_and_gsm8k_sft_files_inspect_clean_and_load(tmp_path):
    import json

    lines = [{"messages": [{"role": "user", "content": "copy 1"}, {"role": "assistant", "content": "1"}]},
             {"messages": [{"role": "user", "content": "2 + 2"},
                           {"role": "assistant", "content": "", "tool_calls": [
                               {"type": "function", "function": {"name": "calculator", "arguments": {"x": "2+2"}}}]},
                           {"role": "tool", "content": "4"}, {"role": "assistant", "content": "4"}],
              "tools": [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]}]
    src = tmp_path / "chats.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = cli("data", "messages", src, "--out", tmp_path / "chats", "--test-size", "1")
    assert res.exit_code == 0, res.output
    for split in ("train", "test"):
        res = cli("data", "inspect", tmp_path / "chats" / f"{split}.parquet")
        assert res.exit_code == 0 and "valid:" in res.output, res.output
    ds = SFTDataset(tmp_path / "chats" / "test.parquet", build_tiny_tokenizer(), SFTDataConfig())
    assert ds.row(0)[1].sum() > 0

    src.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    res = cli("data", "messages", src, "--out", tmp_path / "bad")
    assert res.exit_code == 1 and "chats.jsonl line 1: the conversation has no assistant turn" in res.output

    res = cli("data", "gsm8k", "--format", "sft", "--no-hub", "--limit", "4", "--out", tmp_path / "gsm")
    assert res.exit_code == 0, res.output
    res = cli("data", "inspect", tmp_path / "gsm" / "train.parquet")
    assert res.exit_code == 0 and "valid:" in res.output, res.output
    row = pq.read_table(tmp_path / "gsm" / "train.parquet").to_pylist()[0]
    assert row["messages"][:-1] == row["prompt"]
    answer = row["messages"][-1]["content"]
    assert answer.endswith(f"#### {row['reward_model']['ground_truth']}") and "<<" not in answer


def test_train_sft_dry_run_and_a_bad_key(tmp_path):
    data = write(tmp_path / "t.parquet", [{"prompt": "copy 3", "response": "3"}])
    res = cli("train", "sft", f"data.train_files={data}", "model.path=smollm2-135m-instruct", "use_remove_padding=true",
              f"trainer.default_local_dir={tmp_path / 'ck'}", "data.train_batch_size=1", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "resource plan (sft)" in res.output
    assert "pre-flight ok: 1 data file(s), 1 training conversations; model smollm2" in res.output
    assert "verl key use_remove_padding=true ->" in res.output
    res = cli("train", "sft", f"data.train_files={data}", "data.messages_kye=x", "--dry-run")
    assert res.exit_code == 1 and "Closest valid keys: data.messages_key" in res.output
