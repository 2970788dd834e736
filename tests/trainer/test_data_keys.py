"""verl's data keys as the trainer reads them, without Ray: the trainer is built on a scripted rollout engine
(it echoes a digit per sample), so its datasets, loader, validation order, reward stage and DAPO's generation
batches are the real ones.

Keys: data.train_max_samples / val_max_samples (-1 = all), data.return_raw_chat, data.reward_fn_key,
data.validation_shuffle, data.gen_batch_size (dynamic sampling), data.filter_overlong_prompts.
"""

from __future__ import annotations

import re
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.step.step_result import Timer
from tests.trainer.conftest import toy_overrides

DIGITS = re.compile(r"copy the digits : ([\d ]+)")


class ScriptedRollout:
    """Answers each prompt's digits: in the groups of `n` rows at even group positions, the first sample right
    and the rest wrong (the group's scores differ); at odd positions every sample wrong (all equal)."""

    def __init__(self, tokenizer, n: int) -> None:
        self.tok, self.n = tokenizer, n
        self.calls: list[Batch] = []

    def generate_sequences(self, batch: Batch, **_: object) -> Batch:
        self.calls.append(batch)
        texts = []
        for row, (ids, mask) in enumerate(zip(batch["input_ids"], batch["attention_mask"])):
            digits = DIGITS.search(self.tok.decode(ids[mask.bool()])).group(1).strip()
            right = (row // self.n) % 2 == 0 and row % self.n == 0
            texts.append(digits if right else "x")
        ids = [self.tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        width = max(len(i) for i in ids)
        responses = torch.full((len(ids), width), self.tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(responses)
        for i, seq in enumerate(ids):
            responses[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
        return Batch({"responses": responses, "response_mask": mask})


def _trainer(toy_data, tiny_model, tmp_path, algo: str = "grpo", **extra):
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer

    values = dict(data__train_batch_size=4, actor_rollout_ref__actor__ppo_mini_batch_size=4,
                  actor_rollout_ref__rollout__n=2, data__val_files=toy_data / "test.parquet")
    cfg = load_config(algo, toy_overrides(toy_data, tiny_model, tmp_path, **(values | extra)))
    rollout = ScriptedRollout(None, cfg.actor_rollout_ref.rollout.n)
    workers = types.SimpleNamespace(rollout=rollout, reward_model=None, world_size=1, memory_peaks=lambda skip: {},
                                    weights=None)
    trainer = RLTrainer(cfg, workers=workers)
    rollout.tok = trainer.tokenizer
    return trainer, rollout


def test_row_limits_and_raw_chat(toy_data, tiny_model, tmp_path):
    trainer, _ = _trainer(toy_data, tiny_model, tmp_path, data__train_max_samples=40, data__val_max_samples=-1,
                          data__return_raw_chat=False)
    assert len(trainer.train_set) == 40 and len(trainer.train_loader) == 10
    assert len(trainer.val_set) == pq.read_metadata(toy_data / "test.parquet").num_rows  # -1 = every row
    assert "raw_prompt" not in trainer.train_set.columns and "raw_prompt" not in trainer.val_set.columns
    default, _ = _trainer(toy_data, tiny_model, tmp_path)
    assert default.cfg.data.seed == 1  # data.seed=null keeps rlkit's data order
    assert len(default.train_set) == pq.read_metadata(toy_data / "train.parquet").num_rows
    assert "raw_prompt" in default.train_set.get_batch([0]).non_tensors


def test_filter_overlong_prompts_reaches_both_datasets(toy_data, tiny_model, tmp_path):
    """Rows 3 and 7 of 16 get a prompt past max_prompt_length=32: the filter drops exactly them, in training
    and validation, so truncation=error never sees them."""
    rows = pq.read_table(toy_data / "train.parquet").slice(0, 16).to_pylist()
    for i in (3, 7):
        rows[i]["prompt"] = [{"role": "user", "content": "copy the digits : " + " ".join("7" * 40)}]
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    trainer, _ = _trainer(toy_data, tiny_model, tmp_path, data__train_files=path, data__val_files=path,
                          data__filter_overlong_prompts=True)
    for ds in (trainer.train_set, trainer.val_set):
        assert ds.num_overlong_dropped == 2 and len(ds) == 14
        kept = [ds[i]["index"] for i in range(len(ds))]
        assert kept == [r["extra_info"]["index"] for i, r in enumerate(rows) if i not in (3, 7)]
    with pytest.raises(UserError, match=r"mixed.parquet row 3: prompt has \d+ tokens"):
        _trainer(toy_data, tiny_model, tmp_path, data__train_files=path)


def test_validation_shuffle(toy_data, tiny_model, tmp_path):
    """Off: the rows in file order. On: every row once, in an order that changes from one validation to the next."""
    def seen(trainer, rollout):
        rollout.calls.clear()
        metrics = trainer.validate()
        assert "val/rlkit/toy_copy/score/mean@1" in metrics
        prompts = [trainer.tokenizer.decode(ids[mask.bool()]) for call in rollout.calls
                   for ids, mask in zip(call["input_ids"], call["attention_mask"])]
        return prompts

    kw = dict(data__val_batch_size=32, actor_rollout_ref__rollout__val_kwargs__n=1)
    plain, rollout = _trainer(toy_data, tiny_model, tmp_path, **kw)
    in_order = seen(plain, rollout)
    texts = [plain.tokenizer.decode(plain.val_set[i]["input_ids"]) for i in range(len(plain.val_set))]
    assert in_order == texts
    shuffled, rollout = _trainer(toy_data, tiny_model, tmp_path, data__validation_shuffle=True, **kw)
    first, second = seen(shuffled, rollout), seen(shuffled, rollout)
    assert sorted(first) == sorted(second) == sorted(texts)
    assert first != texts and second != first


def test_reward_fn_key_selects_the_scorer_column(toy_data, tiny_model, tmp_path):
    """Rows whose data_source has no scorer are scored by the toy scorer named in another column."""
    table = pq.read_table(toy_data / "train.parquet").slice(0, 16)
    table = table.set_column(table.schema.get_field_index("data_source"), "data_source",
                             [["mystery"] * 16]).append_column("scorer", [["rlkit/toy_copy"] * 16])
    pq.write_table(table, tmp_path / "keyed.parquet")
    files = dict(data__train_files=tmp_path / "keyed.parquet", data__val_files="null")
    trainer, rollout = _trainer(toy_data, tiny_model, tmp_path, data__reward_fn_key="scorer", **files)
    batch, _ = trainer.source.next_batch(Timer())
    scores = batch["token_level_scores"].sum(-1).tolist()
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # the scripted answers, scored by toy_copy
    assert set(batch["data_source"]) == {"mystery"}  # the batch keeps its data_source
    plain, _ = _trainer(toy_data, tiny_model, tmp_path, **files)
    with pytest.raises(UserError, match="no reward scorer for data_source 'mystery'"):
        plain.source.next_batch(Timer())
    with pytest.raises(UserError, match="data.reward_fn_key='nope' names no column"):
        _trainer(toy_data, tiny_model, tmp_path, data__reward_fn_key="nope", **files)


def test_gen_batch_size_sets_the_prompts_per_generation_with_dynamic_sampling(toy_data, tiny_model, tmp_path):
    """DAPO: generation batches of gen_batch_size=6 prompts (half of their groups kept) refill a step of
    train_batch_size=4 prompts: two generations of 12 samples, 6 groups kept, the batch cut to 4 x 2 rows."""
    trainer, rollout = _trainer(toy_data, tiny_model, tmp_path, data__gen_batch_size=6,
                                algorithm__filter_groups__enable=True, data__train_max_samples=60)
    assert len(trainer.train_loader) == 10  # the loader's batches are generation batches
    batch, metrics = trainer.source.next_batch(Timer())
    assert [len(c) for c in rollout.calls] == [12, 12]
    assert metrics == {"dapo/kept_groups": 6, "dapo/gen_batches": 2}
    assert len(batch) == 8 and len(set(batch["uid"])) == 4
    scores = batch["token_level_scores"].sum(-1).view(4, 2)
    assert torch.all(scores[:, 0] != scores[:, 1])  # only groups whose scores differ were kept
    with pytest.raises(UserError, match="data.gen_batch_size=6 differs from data.train_batch_size=4"):
        _trainer(toy_data, tiny_model, tmp_path, data__gen_batch_size=6)

