"""RLDataset + collate: chat template, left padding, masks/positions, truncation modes, bad input."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from rlkit.data import RLDataset, collate, left_pad
from rlkit.errors import UserError

from .conftest import toy_row

MSGS = [
    [{"role": "user", "content": "copy the digits : 1 2 3"}],
    [{"role": "system", "content": "think step by step"}, {"role": "user", "content": "what is 2 + 3 ?"}],
    [{"role": "user", "content": "copy the digits : 9"}],
]


@pytest.fixture
def three_rows(write_parquet):
    rows = [toy_row(i, prompt=m) for i, m in enumerate(MSGS)]
    rows[2]["tools_kwargs"] = {"calculator": {"x": 1}}
    for r in rows[:2]:
        r["tools_kwargs"] = None
    return write_parquet(rows)


def expected_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_chat_template_left_padding_masks_and_positions(three_rows, tokenizer):
    ds = RLDataset(three_rows, tokenizer, max_prompt_length=24)
    assert len(ds) == 3
    batch = ds.get_batch([0, 1, 2])
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    assert ids.shape == mask.shape == pos.shape == (3, 24)
    assert ids.dtype == mask.dtype == pos.dtype == torch.long
    for i, messages in enumerate(MSGS):
        want = expected_ids(tokenizer, messages)
        n = len(want)
        assert tokenizer.unk_token_id not in want
        assert ids[i, -n:].tolist() == want  # template applied, no special tokens added on top
        assert ids[i, : 24 - n].eq(tokenizer.pad_token_id).all()  # left padding
        assert mask[i].tolist() == [0] * (24 - n) + [1] * n
        assert pos[i].tolist() == [0] * (24 - n) + list(range(n))
    assert ids[0, -2:].tolist() == tokenizer.convert_tokens_to_ids(["<|im_start|>", "assistant"])


def test_non_tensor_fields(three_rows, tokenizer):
    batch = RLDataset(three_rows, tokenizer, max_prompt_length=24).get_batch([2, 0])
    assert set(batch.non_tensors) == {
        "raw_prompt", "data_source", "reward_model", "extra_info", "ability", "index", "tools_kwargs"
    }  # fmt: skip
    assert batch["raw_prompt"][0] == MSGS[2] and batch["raw_prompt"][1] == MSGS[0]
    assert list(batch["data_source"]) == ["rlkit/toy_copy"] * 2
    assert list(batch["ability"]) == ["toy"] * 2
    assert batch["reward_model"][0] == {"style": "rule", "ground_truth": "1 2 3"}
    assert batch["extra_info"][0] == {"split": "train", "index": 2}
    assert list(batch["index"]) == [2, 0]
    assert batch["tools_kwargs"][0] == {"calculator": {"x": 1}} and batch["tools_kwargs"][1] is None
    assert all(isinstance(v, np.ndarray) and v.dtype == object for v in batch.non_tensors.values())


def test_collate_and_left_pad_directly():
    ids, mask, pos = left_pad([[5, 6], [7], []], 4, pad_token_id=0)
    assert ids.tolist() == [[0, 0, 5, 6], [0, 0, 0, 7], [0, 0, 0, 0]]
    assert mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert pos.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="row 0 has 5 tokens"):
        left_pad([[1] * 5], 4, pad_token_id=0)
    batch = collate([{"input_ids": [3], "uid": "a"}, {"input_ids": [4, 5], "uid": "b"}], 3, pad_token_id=9)
    assert batch["input_ids"].tolist() == [[9, 9, 3], [9, 4, 5]] and list(batch["uid"]) == ["a", "b"]


def _long_and_short(write_parquet):
    long = "copy the digits : " + " ".join(str(i % 10) for i in range(40))
    rows = [toy_row(0), toy_row(1, prompt=[{"role": "user", "content": long}]), toy_row(2, "4 5 6")]
    return write_parquet(rows, "long.parquet"), long


def test_truncation_error_names_file_and_row(write_parquet, tokenizer):
    path, _ = _long_and_short(write_parquet)
    with pytest.raises(UserError, match=rf"{path} row 1: prompt has \d+ tokens, more than max_prompt_length=16"):
        RLDataset(path, tokenizer, max_prompt_length=16)


def test_truncation_filter_drops_and_logs(write_parquet, tokenizer, caplog):
    path, _ = _long_and_short(write_parquet)
    with caplog.at_level(logging.WARNING, logger="rlkit.data.dataset"):
        ds = RLDataset(path, tokenizer, max_prompt_length=16, truncation="filter")
    assert len(ds) == 2 and ds.num_filtered == 1
    assert "filtered 1 of 3 prompts" in caplog.text
    assert list(ds.get_batch([0, 1])["index"]) == [0, 2]


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
@pytest.mark.parametrize("max_len", [16, 15])
def test_truncation_left_right_middle(write_parquet, tokenizer, mode, max_len):
    path, long = _long_and_short(write_parquet)
    full = expected_ids(tokenizer, [{"role": "user", "content": long}])
    ds = RLDataset(path, tokenizer, max_prompt_length=max_len, truncation=mode)
    assert len(ds) == 3 and ds.num_truncated == 1
    row = ds.get_batch([1])["input_ids"][0].tolist()
    head = max_len // 2
    want = {"left": full[-max_len:], "right": full[:max_len], "middle": full[:head] + full[-(max_len - head):]}
    assert row == want[mode]
    assert ds.get_batch([1])["attention_mask"].sum() == max_len
    assert ds.get_batch([0])["input_ids"][0, -len(expected_ids(tokenizer, toy_row(0)["prompt"])):].tolist() == \
        expected_ids(tokenizer, toy_row(0)["prompt"])  # short prompts untouched


def _mixed_lengths(write_parquet, name="mixed.parquet"):
    """Rows 0-5, ids 10..15; rows 1 and 4 are over 16 tokens (their ids are what the filter must drop)."""
    long = "copy the digits : " + " ".join(str(i % 10) for i in range(40))
    rows = [toy_row(10 + i, prompt=[{"role": "user", "content": long}]) if i in (1, 4) else toy_row(10 + i)
            for i in range(6)]
    return write_parquet(rows, name)


@pytest.mark.parametrize("truncation", ["error", "left", "filter"])
def test_filter_overlong_prompts_drops_exactly_the_long_rows_first(write_parquet, tokenizer, caplog, truncation):
    """verl's order: the filter drops over-long rows before `truncation` looks (so even `error` passes)."""
    path = _mixed_lengths(write_parquet)
    with caplog.at_level(logging.WARNING, logger="rlkit.data.dataset"):
        ds = RLDataset(path, tokenizer, max_prompt_length=16, truncation=truncation, filter_overlong_prompts=True)
    assert list(ds.get_batch(range(len(ds)))["index"]) == [10, 12, 13, 15]
    assert ds.num_overlong_dropped == 2 and ds.num_truncated == ds.num_filtered == 0
    assert f"{path}: filter_overlong_prompts kept 4 rows, dropped 2" in caplog.text


def test_filter_overlong_prompts_off_leaves_rows_to_truncation(write_parquet, tokenizer):
    ds = RLDataset(_mixed_lengths(write_parquet), tokenizer, max_prompt_length=16, truncation="left")
    assert len(ds) == 6 and ds.num_truncated == 2 and ds.num_overlong_dropped == 0


def test_filter_overlong_prompts_counts_per_file(write_parquet, tokenizer, caplog):
    a, b = _mixed_lengths(write_parquet, "a.parquet"), write_parquet([toy_row(i) for i in range(3)], "b.parquet")
    with caplog.at_level(logging.WARNING, logger="rlkit.data.dataset"):
        ds = RLDataset([a, b], tokenizer, max_prompt_length=16, filter_overlong_prompts=True)
    assert len(ds) == 7
    assert f"{a}: filter_overlong_prompts kept 4 rows, dropped 2" in caplog.text
    assert f"{b}: filter_overlong_prompts kept 3 rows, dropped 0" in caplog.text


@pytest.mark.parametrize("return_raw_chat", [True, False])
def test_return_raw_chat(three_rows, tokenizer, return_raw_chat):
    batch = RLDataset(three_rows, tokenizer, max_prompt_length=24, return_raw_chat=return_raw_chat).get_batch([1])
    assert ("raw_prompt" in batch.non_tensors) is return_raw_chat
    if return_raw_chat:
        assert batch["raw_prompt"][0] == MSGS[1]
    assert batch["input_ids"][0, -len(expected_ids(tokenizer, MSGS[1])):].tolist() == expected_ids(tokenizer, MSGS[1])


def test_unknown_truncation_mode(three_rows, tokenizer):
    with pytest.raises(UserError, match="unknown truncation mode 'lft'.*Did you mean 'left'"):
        RLDataset(three_rows, tokenizer, truncation="lft")


def test_all_filtered_is_an_error(write_parquet, tokenizer):
    path, _ = _long_and_short(write_parquet)
    with pytest.raises(UserError, match="no prompts left"):
        RLDataset(path, tokenizer, max_prompt_length=2, truncation="filter")


def test_other_toolkits_files_load_unchanged(tmp_path, write_parquet, tokenizer):
    """verl-style gsm8k parquet (pandas, content/role order, other extra_info fields) + one of ours."""
    frame = pd.DataFrame(
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"content": f"what is {i} + 1 ?", "role": "user"}],
                "ability": "math",
                "reward_model": {"ground_truth": str(i + 1), "style": "rule"},
                "extra_info": {"answer": f"#### {i + 1}", "index": 100 + i, "question": "q", "split": "test"},
            }
            for i in range(3)
        ]
    )
    frame.to_parquet(tmp_path / "verl.parquet")
    ours = write_parquet([toy_row(0)], "ours.parquet")
    ds = RLDataset([tmp_path / "verl.parquet", ours], tokenizer, max_prompt_length=32)
    assert len(ds) == 4
    batch = ds.get_batch([0, 3])
    assert batch["raw_prompt"][0] == [{"role": "user", "content": "what is 0 + 1 ?"}]
    want = expected_ids(tokenizer, batch["raw_prompt"][0])
    assert batch["input_ids"][0, -len(want) :].tolist() == want
    assert list(batch["index"]) == [100, 0]
    assert batch["reward_model"][0]["ground_truth"] == "1"
    assert batch["extra_info"][0]["answer"] == "#### 1" and batch["extra_info"][1] == {"split": "train", "index": 0}
    # a directory expands to its parquet files
    assert len(RLDataset(tmp_path, tokenizer, max_prompt_length=32)) == 4


def test_options_prompt_key_template_override_max_samples(write_parquet, tokenizer):
    rows = [toy_row(i, f"{i} 0 0") for i in range(5)]
    for r in rows:
        r["messages"] = r.pop("prompt")
    path = write_parquet(rows)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    ds = RLDataset(path, tokenizer, max_prompt_length=8, prompt_key="messages", chat_template=template, max_samples=3)
    assert len(ds) == 3
    batch = ds.get_batch([1])
    assert (
        batch["input_ids"][0, -7:].tolist()
        == tokenizer("copy the digits : 1 0 0", add_special_tokens=False)["input_ids"]
    )
    assert batch["raw_prompt"][0] == [{"role": "user", "content": "copy the digits : 1 0 0"}]
    assert "messages" not in batch


def test_pad_id_falls_back_to_eos(three_rows, tokenizer):
    class NoPad:
        chat_template = tokenizer.chat_template
        pad_token_id = None
        eos_token_id = tokenizer.eos_token_id

        def apply_chat_template(self, *a, **k):
            return tokenizer.apply_chat_template(*a, **k)

        def __call__(self, *a, **k):
            return tokenizer(*a, **k)

    ds = RLDataset(three_rows, NoPad(), max_prompt_length=24)
    assert ds.pad_token_id == tokenizer.eos_token_id
    assert ds.get_batch([0])["input_ids"][0, 0] == tokenizer.eos_token_id


# ------------------------------------------------------------------ bad input: one-line UserErrors
def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_missing_and_empty_files(tmp_path, tokenizer):
    with pytest.raises(UserError) as exc:
        RLDataset(tmp_path / "nope.parquet", tokenizer)
    assert "nope.parquet: file not found" in _one_line(exc)
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(UserError) as exc:
        RLDataset(tmp_path / "empty.parquet", tokenizer)
    assert "empty.parquet: file is empty" in _one_line(exc)
    with pytest.raises(UserError, match="no data files given"):
        RLDataset([], tokenizer)
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match="directory has no .parquet files"):
        RLDataset(tmp_path / "d", tokenizer)


def test_zero_rows(write_parquet, tokenizer):
    path = write_parquet([], schema=pa.Table.from_pylist([toy_row(0)]).schema)
    with pytest.raises(UserError) as exc:
        RLDataset(path, tokenizer)
    assert f"{path}: file has no rows" in _one_line(exc)


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([{k: v for k, v in toy_row(0).items() if k != "reward_model"}], "column 'reward_model': column is missing"),
        ([toy_row(0, prompt="copy the digits : 1")], "column 'prompt': has type string, expected list"),
        (
            [toy_row(0), toy_row(1, prompt=[{"role": "robot", "content": "hi"}])],
            "row 1, column 'prompt[0].role': unknown role 'robot'",
        ),
        (
            [toy_row(0, reward_model={"style": "rule", "ground_truth": ""}), toy_row(1)],
            "row 0, column 'reward_model.ground_truth': is empty",
        ),
    ],
    ids=["wrong columns", "non-list prompt", "unknown role", "empty ground truth"],
)
def test_bad_rows(write_parquet, tokenizer, rows, expected):
    path = write_parquet(rows)
    with pytest.raises(UserError) as exc:
        RLDataset(path, tokenizer)
    msg = _one_line(exc)
    assert msg.startswith(f"{path}: ") and expected in msg


def test_tokenizer_without_chat_template(three_rows, tokenizer):
    plain = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>")
    assert not plain.chat_template
    with pytest.raises(UserError) as exc:
        RLDataset(three_rows, plain)
    assert "has no chat template" in _one_line(exc)


def test_a_template_that_rejects_a_row(write_parquet, tokenizer):
    path = write_parquet([toy_row(0), toy_row(1, prompt=[{"role": "system", "content": "x"}])])
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(UserError) as exc:
        RLDataset(path, tokenizer, chat_template=template)
    assert f"{path} row 1, column 'prompt': the chat template failed (no system role)" in _one_line(exc)
