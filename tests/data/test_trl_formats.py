"""`rlkit train sft` and `rlkit train dpo` read TRL's dataset formats directly: JSON Lines, JSON and parquet files,
"standard" (`prompt`/`chosen`/`rejected`, `prompt`/`completion`, `text`) and "conversational" (message lists,
`messages`, implicit-prompt preference pairs), each read into the same tokens as rlkit's own layout."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.config.sft_schema import SFTDataConfig
from rlkit.data.preference import PreferenceDataset
from rlkit.data.sft_dataset import SFTDataset
from rlkit.errors import UserError

USER = [{"role": "user", "content": "copy the digits : 1 2"}]
ANSWER = [{"role": "assistant", "content": "1 2"}]


def write(path, rows, fmt):
    """rows as .jsonl (a line each), .json (a list) or .parquet."""
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def pairs(data: PreferenceDataset) -> list[tuple[list[int], list[int], list[int]]]:
    return [(p.prompt.tolist(), p.chosen.tolist(), p.rejected.tolist()) for p in data.pairs]


def sft_rows(data: SFTDataset) -> list[tuple[list[int], list[int]]]:
    return [tuple(x.tolist() for x in data.row(i)) for i in range(len(data))]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_preference_formats_read_as_the_same_pairs(tokenizer, tmp_path, fmt):
    standard = [{"prompt": "copy the digits : 1 2", "chosen": "1 2", "rejected": "2 1"}]
    conversational = [{"prompt": USER, "chosen": ANSWER, "rejected": [{"role": "assistant", "content": "2 1"}]}]
    implicit = [{"chosen": USER + ANSWER, "rejected": USER + [{"role": "assistant", "content": "2 1"}]}]
    expected = pairs(PreferenceDataset(write(tmp_path / "ref.parquet", conversational, "parquet"), tokenizer))
    assert expected[0][1] != expected[0][2]
    for name, rows in (("standard", standard), ("conversational", conversational), ("implicit", implicit)):
        path = write(tmp_path / f"{name}.{fmt}", rows, fmt)
        assert pairs(PreferenceDataset(path, tokenizer)) == expected, name


def test_implicit_prompt_of_strings_splits_at_a_word(tokenizer, tmp_path):
    from rlkit.data.preference_schema import split_implicit_prompt

    assert split_implicit_prompt("the answer is 1 2", "the answer is 12") == ("the answer is", " 1 2", " 12")
    assert split_implicit_prompt(USER + ANSWER, USER + ANSWER) is None  # nothing to prefer
    path = write(tmp_path / "same.jsonl", [{"chosen": "1 2", "rejected": "1 2"}], "jsonl")
    with pytest.raises(UserError, match=r"same.jsonl: row 0, column 'prompt': is null; give a prompt column, or "
                                        r"\(implicit prompt\) completions that start alike"):
        PreferenceDataset(path, tokenizer)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_sft_formats_read_as_the_same_conversation(tokenizer, tmp_path, fmt):
    data = SFTDataConfig(max_length=64)
    expected = sft_rows(SFTDataset(write(tmp_path / "ref.parquet", [{"messages": USER + ANSWER}], "parquet"),
                                   tokenizer, data))
    assert sum(expected[0][1]) > 0
    for name, rows in (("messages", [{"messages": USER + ANSWER}]),
                       ("standard", [{"prompt": "copy the digits : 1 2", "completion": "1 2"}]),
                       ("conversational", [{"prompt": USER, "completion": ANSWER}]),
                       ("verl", [{"prompt": "copy the digits : 1 2", "response": "1 2"}])):
        path = write(tmp_path / f"{name}.{fmt}", rows, fmt)
        assert sft_rows(SFTDataset(path, tokenizer, data)) == expected, name


def test_sft_text_trains_every_token_with_eos(tokenizer, tmp_path):
    path = write(tmp_path / "lm.jsonl", [{"text": "copy the digits : 1 2"}, {"text": "1 2 3"}], "jsonl")
    data = SFTDataset(path, tokenizer, SFTDataConfig(max_length=64))
    ids, mask = data.row(0)
    assert ids.tolist() == tokenizer("copy the digits : 1 2")["input_ids"] + [tokenizer.eos_token_id]
    assert np.all(mask == 1)
    with pytest.raises(UserError, match=r"lm2.jsonl row 1: column 'text' is empty"):
        SFTDataset(write(tmp_path / "lm2.jsonl", [{"text": "1"}, {"text": ""}], "jsonl"), tokenizer, SFTDataConfig())


def test_broken_json_files_are_one_line(tokenizer, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n{not json\n")
    with pytest.raises(UserError, match=r"bad.jsonl line 2: not valid JSON"):
        PreferenceDataset(bad, tokenizer)
    mixed = write(tmp_path / "mixed.jsonl", [{"messages": USER + ANSWER}, {"messages": "text"}], "jsonl")
    with pytest.raises(UserError, match=r"mixed.jsonl: the rows do not share one type per column"):
        SFTDataset(mixed, tokenizer, SFTDataConfig())
    with pytest.raises(UserError, match=r"cols.json: no data.messages_key column 'messages'.*TRL's"):
        SFTDataset(write(tmp_path / "cols.json", {"question": ["a"], "answer": ["b"]}, "json"), tokenizer,
                   SFTDataConfig())
