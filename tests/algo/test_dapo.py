import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.dapo import dynamic_sampling_filter, overlong_reward_shaping

UIDS = np.array(["a", "a", "a", "b", "b", "b", "c", "c", "d"], dtype=object)
ACC = [1, 1, 1, 0, 1, 0, 0, 0, 3]


def test_dynamic_sampling_by_hand():
    res = dynamic_sampling_filter(np.array(ACC, dtype=float), UIDS)
    # a (all 1) and c (all 0) carry no signal; b varies; d is a singleton (kept by default)
    assert res.keep_mask.tolist() == [False, False, False, True, True, True, False, False, True]
    assert res.keep_indices.tolist() == [3, 4, 5, 8]
    assert (res.kept_groups, res.total_groups) == (2, 4)
    strict = dynamic_sampling_filter(torch.tensor(ACC, dtype=torch.float32), list(UIDS), keep_singletons=False)
    assert strict.keep_indices.tolist() == [3, 4, 5] and strict.kept_groups == 1


def test_dynamic_sampling_tolerance_and_length_check():
    res = dynamic_sampling_filter([0.5, 0.5 + 1e-9, 1.0, 2.0], ["x", "x", "y", "y"], atol=1e-6)
    assert res.keep_indices.tolist() == [2, 3]
    with pytest.raises(ValueError, match="uids"):
        dynamic_sampling_filter([1.0, 2.0], ["x"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2)), min_size=1, max_size=20))
def test_dynamic_sampling_keeps_exactly_the_varied_groups(rows):
    uids = [u for u, _ in rows]
    vals = [float(v) for _, v in rows]
    res = dynamic_sampling_filter(vals, uids, keep_singletons=False)
    for u in set(uids):
        group = [v for uu, v in zip(uids, vals) if uu == u]
        kept = [res.keep_mask[i] for i, uu in enumerate(uids) if uu == u]
        assert all(k == (len(set(group)) > 1) for k in kept)
    assert res.total_groups == len(set(uids))


def test_overlong_shaping_by_hand():
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    # max 20, buffer 4: free up to 16, then -1/4 per token: -1 at 20, and on past it
    pen = overlong_reward_shaping(lengths, max_response_length=20, overlong_buffer_len=4, penalty_factor=1.0)
    assert pen.dtype == torch.float32
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -2.25])  # verl: no floor past the max
    half = overlong_reward_shaping(np.array([17, 20]), 20, 4, penalty_factor=0.5)
    assert half.tolist() == pytest.approx([-0.125, -0.5])
    assert overlong_reward_shaping([18], 20, 4, 1.0).tolist() == pytest.approx([-0.5])
    with pytest.raises(ValueError, match="overlong_buffer_len"):
        overlong_reward_shaping([1], 20, 0, 1.0)
    with pytest.raises(ValueError, match="penalty_factor"):
        overlong_reward_shaping([1], 20, 4, -1.0)
