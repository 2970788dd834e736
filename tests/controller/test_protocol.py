import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.protocol import Batch


def make(n: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        {"x": torch.randn(n, 3, generator=g), "ids": torch.arange(n)},
        {"text": [f"row{i}" for i in range(n)], "gt": [{"a": i} for i in range(n)]},
        {"flag": True},
    )


def test_len_and_mismatch_error():
    assert len(make(5)) == 5
    with pytest.raises(ValueError, match="disagree"):
        Batch({"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(ValueError, match="non-tensor 'c'=2"):
        Batch({"a": torch.zeros(3)}, {"c": ["x", "y"]})


def test_nested_lists_stay_objects():
    b = Batch(non_tensors={"prompt": [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]})
    assert b["prompt"].shape == (2,) and b["prompt"][1][0]["content"] == "yo"


def test_select_pop_union():
    b = make(4)
    s = b.select(["x", "text"])
    assert set(s.keys()) == {"x", "text"}
    popped = b.pop(["gt"])
    assert "gt" not in b and popped["gt"][2] == {"a": 2}
    b.union(popped)
    assert "gt" in b
    with pytest.raises(ValueError, match="tensor 'x'"):
        b.union(Batch({"x": torch.zeros(4, 3)}))
    with pytest.raises(KeyError, match="missing keys"):
        b.select(["nope"])


def test_concat_merges_metrics_and_checks_keys():
    a, b = make(2), make(3, seed=1)
    a.meta["metrics"] = {"loss": 1.0}
    b.meta["metrics"] = {"loss": [2.0, 3.0]}
    c = Batch.concat([a, b])
    assert len(c) == 5 and c.meta["metrics"]["loss"] == [1.0, 2.0, 3.0]
    assert c["text"][3] == "row1"
    with pytest.raises(ValueError, match="keys"):
        Batch.concat([a, a.select(["x", "ids"])])


def test_chunk_split_repeat_reorder_index():
    b = make(6)
    assert [len(c) for c in b.chunk(3)] == [2, 2, 2]
    with pytest.raises(ValueError, match="pad_to_divisor"):
        b.chunk(4)
    assert [len(c) for c in b.split(4)] == [4, 2]
    r = make(2).repeat(3, interleave=True)
    assert r["ids"].tolist() == [0, 0, 0, 1, 1, 1] and list(r["text"]) == ["row0"] * 3 + ["row1"] * 3
    t = make(2).repeat(2, interleave=False)
    assert t["ids"].tolist() == [0, 1, 0, 1]
    b2 = make(4)
    b2.reorder([3, 2, 1, 0])
    assert b2["ids"].tolist() == [3, 2, 1, 0] and b2["text"][0] == "row3"
    m = make(4).index(torch.tensor([True, False, True, False]))
    assert m["ids"].tolist() == [0, 2]
    assert len(make(5)[1:3]) == 2 and make(5)[4]["ids"].tolist() == [4]


def test_pad_unpad_roundtrip():
    b = make(5)
    p, pad = b.pad_to_divisor(4)
    assert len(p) == 8 and pad == 3
    assert p.unpad(pad).equals(b)


def test_pickle_roundtrip_bf16_and_objects():
    b = make(3)
    b["h"] = torch.randn(3, 2).to(torch.bfloat16)
    out = pickle.loads(pickle.dumps(b, protocol=5))
    assert out.equals(b) and out["h"].dtype == torch.bfloat16


def test_pickle_is_cheap_for_many_tensors():
    b = Batch({f"t{i}": torch.zeros(8, 4) for i in range(200)})
    size = len(pickle.dumps(b, protocol=5))
    assert size < 200 * (8 * 4 * 4 + 400), size


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 8))
def test_property_pad_chunk_concat_roundtrip(n, k):
    b = make(n)
    padded, pad = b.pad_to_divisor(k)
    assert len(padded) % k == 0 and pad < k
    back = Batch.concat(padded.chunk(k)).unpad(pad)
    assert back.equals(b)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), st.integers(1, 5), st.booleans())
def test_property_repeat_counts(n, times, interleave):
    b = make(n)
    r = b.repeat(times, interleave=interleave)
    assert len(r) == n * times
    counts = np.bincount(r["ids"].numpy(), minlength=n)
    assert (counts == times).all()
    # every non-tensor row follows its tensor row
    assert all(r["text"][i] == f"row{int(r['ids'][i])}" for i in range(len(r)))
