import pytest
import torch

from rlkit.data.preference import PreferenceDataset, as_sequences, split_sides
from rlkit.errors import UserError


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_strings_and_messages_tokenize_as_the_policy_sees_them(tokenizer, write_parquet):
    rows = [
        {"prompt": "copy the digits : 1 2", "chosen": "1 2", "rejected": "2 1 3"},
        {"prompt": [{"role": "system", "content": "think"}, {"role": "user", "content": "what is 2 + 3 ?"}],
         "chosen": [{"role": "assistant", "content": "5"}], "rejected": [{"role": "assistant", "content": "6 ."}]},
    ]
    strings = write_parquet(rows[:1], "strings.parquet")
    messages = write_parquet(rows[1:], "messages.parquet")  # a column type per file, as parquet stores them
    data = PreferenceDataset([strings, messages], tokenizer)
    assert len(data) == 2
    first = data.pairs[0]
    assert first.prompt.tolist() == ids(tokenizer, "<|im_start|> user copy the digits : 1 2 <|im_end|> "
                                                   "<|im_start|> assistant ")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert first.chosen.tolist() == ids(tokenizer, "1 2") + [end]  # content + end of turn
    assert first.rejected.tolist() == ids(tokenizer, "2 1 3") + [end]
    second = data.pairs[1]
    assert second.prompt.tolist() == ids(tokenizer, "<|im_start|> system think <|im_end|> <|im_start|> user what "
                                                    "is 2 + 3 ? <|im_end|> <|im_start|> assistant ")
    assert second.rejected.tolist() == ids(tokenizer, "6 .") + [end]

    batch = data.get_batch([0, 1])
    assert len(batch) == 2  # one row per pair: micro-batches never part a pair
    chosen_mask, rejected_mask = split_sides(batch["response_mask"])
    assert chosen_mask.sum(-1).tolist() == [3, 2] and rejected_mask.sum(-1).tolist() == [4, 3]
    rows = as_sequences(batch)  # 2B rows in the RL layout, the chosen first
    assert len(rows) == 4 and rows["response_mask"].sum(-1).tolist() == [3, 2, 4, 3]
    assert rows["responses"][0, :3].tolist() == first.chosen.tolist()
    assert rows["responses"][3, :3].tolist() == second.rejected.tolist()
    # left-padded prompt ++ right-padded response, positions continue over the real tokens
    width = rows["input_ids"].shape[1] - rows["responses"].shape[1]
    assert rows["input_ids"][2, :width].tolist()[-len(first.prompt):] == first.prompt.tolist()
    assert torch.equal(rows["input_ids"][:, width:], rows["responses"])
    assert torch.equal(rows["attention_mask"][:, width:], rows["response_mask"])
    real = rows["attention_mask"][0].bool()
    assert rows["position_ids"][0][real].tolist() == list(range(int(real.sum())))


def test_long_prompts_keep_their_end_and_long_completions_their_start(tokenizer, write_parquet):
    path = write_parquet([{"prompt": "copy the digits : 1 2 3 4 5 6", "chosen": "1 2 3 4 5 6", "rejected": "1"}])
    data = PreferenceDataset(path, tokenizer, max_prompt_length=4, max_length=7)
    pair = data.pairs[0]
    full = ids(tokenizer, "<|im_start|> user copy the digits : 1 2 3 4 5 6 <|im_end|> <|im_start|> assistant ")
    assert pair.prompt.tolist() == full[-4:]
    assert pair.chosen.tolist() == ids(tokenizer, "1 2 3")  # 4 + 3 = max_length
    assert data.num_truncated == 1
    with pytest.raises(UserError, match=rf"^{path} row 0: prompt \+ completion take 22 tokens \(prompt 15\)"):
        PreferenceDataset(path, tokenizer, max_prompt_length=4, max_length=7, truncation="error")


@pytest.mark.parametrize(("row", "message"), [
    ({"prompt": "what is 2 + 3 ?", "chosen": "5", "rejected": "  "}, "row 1, column 'rejected': is empty"),
    ({"prompt": "what is 2 + 3 ?", "chosen": [], "rejected": "6"}, "row 1, column 'chosen': is empty"),
    ({"prompt": "", "chosen": "5", "rejected": "6"}, "row 1, column 'prompt': is empty"),
])
def test_bad_rows_name_the_file_and_row(tokenizer, write_parquet, row, message):
    good = {"prompt": "what is 2 + 3 ?", "chosen": "5", "rejected": "6"}
    if isinstance(row["chosen"], list):  # one column type per file: message lists on both rows
        good = {**good, "chosen": [{"role": "assistant", "content": "5"}]}
    path = write_parquet([good, row])
    with pytest.raises(UserError, match=rf"^{path}: {message}"):
        PreferenceDataset(path, tokenizer)


def test_missing_column_and_wrong_role(tokenizer, write_parquet):
    path = write_parquet([{"prompt": "what ?", "chosen": "5"}])
    with pytest.raises(UserError, match=rf"^{path}: column 'rejected': column is missing"):
        PreferenceDataset(path, tokenizer)
    path = write_parquet([{"prompt": "what ?", "chosen": [{"role": "user", "content": "5"}],
                           "rejected": [{"role": "assistant", "content": "6"}]}], "role.parquet")
    with pytest.raises(UserError, match=r"row 0, column 'chosen\[0\].role': is 'user'"):
        PreferenceDataset(path, tokenizer)
