"""The seeded, resumable sampler/loader: per-epoch order, len, drop_last, resume mid-epoch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rlkit.data import ResumableSampler, RLDataLoader, RLDataset
from rlkit.errors import UserError

from .conftest import toy_row


@pytest.fixture
def dataset(write_parquet, tokenizer):
    rows = [toy_row(i, f"{i % 10} {i // 10 % 10} 0") for i in range(23)]
    return RLDataset(write_parquet(rows), tokenizer, max_prompt_length=16)


def order_of(loader, batches=None):
    """Row indices per batch; with `batches`, take only that many (the loader counts what it handed out)."""
    return [list(batch["index"]) for batch in itertools.islice(loader, batches)]


def test_len_and_epoch_orders(dataset):
    loader = RLDataLoader(dataset, batch_size=5, seed=3)
    assert len(loader) == 4  # 23 // 5, last partial batch dropped
    epoch0, epoch1 = order_of(loader), order_of(loader)
    assert loader.epoch == 2
    assert all(len(b) == 5 for b in epoch0 + epoch1)
    flat0 = [i for b in epoch0 for i in b]
    assert len(set(flat0)) == 20 and set(flat0) <= set(range(23))
    assert epoch0 != epoch1  # reshuffled every epoch
    again = RLDataLoader(dataset, batch_size=5, seed=3)
    assert order_of(again) == epoch0 and order_of(again) == epoch1  # same seed, same orders
    assert order_of(RLDataLoader(dataset, batch_size=5, seed=4)) != epoch0


def test_no_shuffle_and_keep_last(dataset):
    loader = RLDataLoader(dataset, batch_size=5, shuffle=False, drop_last=False)
    assert len(loader) == 5
    batches = order_of(loader)
    assert [i for b in batches for i in b] == list(range(23))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]


def test_resume_mid_epoch_gives_the_same_remaining_order(dataset):
    reference = RLDataLoader(dataset, batch_size=4, seed=11)
    full = order_of(reference) + order_of(reference)  # two epochs

    first = RLDataLoader(dataset, batch_size=4, seed=11)
    seen = order_of(first, batches=3)  # stop after 3 batches of epoch 0
    state = first.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3)

    resumed = RLDataLoader(dataset, batch_size=4, seed=11)
    resumed.load_state_dict(state)
    rest = order_of(resumed) + order_of(resumed)
    assert seen + rest == full
    # the tensors follow the indices
    batch = next(iter(RLDataLoader(dataset, batch_size=4, seed=11)))
    assert batch["input_ids"].shape == (4, 16)


def test_resume_at_an_epoch_boundary(dataset):
    loader = RLDataLoader(dataset, batch_size=4, seed=1)
    reference = RLDataLoader(dataset, batch_size=4, seed=1)
    epoch0 = order_of(reference)
    epoch1 = order_of(reference)
    seen = []
    for batch in loader:  # take the whole epoch but save before the iterator notices the end
        seen.append(list(batch["index"]))
        state = loader.state_dict()
    assert seen == epoch0 and state["position"] == len(loader)
    resumed = RLDataLoader(dataset, batch_size=4, seed=1)
    resumed.load_state_dict(state)
    assert order_of(resumed) == epoch1 and resumed.epoch == 2


def test_state_from_another_layout_is_refused(dataset):
    state = RLDataLoader(dataset, batch_size=4).state_dict()
    other = RLDataLoader(dataset, batch_size=5)
    with pytest.raises(UserError, match="batch_size 4 -> 5"):
        other.load_state_dict(state)


def test_sampler_arguments():
    with pytest.raises(UserError, match="fewer than batch_size=8"):
        ResumableSampler(5, 8)
    assert len(ResumableSampler(5, 8, drop_last=False)) == 1
    with pytest.raises(UserError, match="batch_size must be positive"):
        ResumableSampler(5, 0)
    sampler = ResumableSampler(10, 3, seed=0)
    assert np.array_equal(np.sort(sampler.order(0)), np.arange(10))
    assert not np.array_equal(sampler.order(0), sampler.order(1))
