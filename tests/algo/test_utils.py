import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.algo.loss_agg import LOSS_AGG, agg_loss
from rlkit.algo.utils import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from rlkit.errors import UserError

T = torch.tensor


def test_masked_stats_by_hand():
    x = T([1.0, 2.0, 3.0, 100.0])
    m = T([1.0, 1.0, 1.0, 0.0])
    assert masked_sum(x, m).item() == 6.0
    assert masked_mean(x, m).item() == 2.0
    assert masked_var(x, m, unbiased=True).item() == pytest.approx(1.0)
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(x, m)
    assert torch.allclose(w[:3], T([-1.0, 0.0, 1.0]), atol=1e-6)
    assert torch.allclose(masked_whiten(x, m, shift_mean=False)[:3], T([1.0, 2.0, 3.0]), atol=1e-6)


def test_masked_mean_dim_and_empty_rows():
    x = T([[1.0, 3.0], [5.0, 7.0]])
    m = T([[1.0, 1.0], [0.0, 0.0]])
    assert masked_mean(x, m, dim=-1).tolist() == [2.0, 0.0]  # empty row: 0, not NaN
    assert masked_var(x, m, dim=-1).tolist() == [2.0, 0.0]
    assert masked_var(T([4.0]), T([1.0])).item() == 0.0  # n=1: no n/(n-1) blow-up


LOSS = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 non-empty seqs
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 9),  # (3/3 + 4/3 + 0) / 3 rows: constant B*R normaliser
    ],
)
def test_agg_modes_by_hand(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_agg_registry_names_and_unknown():
    assert LOSS_AGG.names() == ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-mean",
                                "token-sum"]
    with pytest.raises(UserError, match="token-mean"):
        agg_loss(LOSS, MASK, "token_mean")


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 7),
    vocab=st.integers(2, 19),
    chunk=st.one_of(st.none(), st.integers(1, 9)),
    seed=st.integers(0, 10_000),
)
def test_chunked_entropy_and_logprobs_match_reference(rows, vocab, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, rows, vocab, generator=g) * 5
    labels = torch.randint(0, vocab, (2, rows), generator=g)
    ref_logp = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref_ent = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(logprobs_from_logits(logits, labels, chunk_size=chunk), ref_logp, atol=1e-5)
    assert torch.allclose(entropy_from_logits(logits, chunk_size=chunk), ref_ent, atol=1e-5)


def test_chunked_gradients_match_unchunked():
    logits = torch.randn(3, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5))
    grads = []
    for chunk in (None, 2):
        logits.grad = None
        (logprobs_from_logits(logits, labels, chunk).sum() + entropy_from_logits(logits, chunk).sum()).backward()
        grads.append(logits.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_entropy_stable_for_extreme_logits_and_bf16():
    logits = T([[1e4, 0.0, -1e4], [0.0, 0.0, 0.0]])
    ent = entropy_from_logits(logits, chunk_size=1)
    assert torch.isfinite(ent).all()
    assert ent[0].item() == pytest.approx(0.0, abs=1e-6)
    assert ent[1].item() == pytest.approx(torch.log(T(3.0)).item(), abs=1e-6)
    bf = torch.randn(4, 32).bfloat16()
    out = logprobs_from_logits(bf, torch.zeros(4, dtype=torch.long), chunk_size=3)
    assert out.dtype == torch.float32
    ref = torch.log_softmax(bf.float(), -1)[:, 0]
    assert torch.allclose(out, ref, atol=1e-5)


def test_logprobs_label_shape_mismatch():
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(torch.randn(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))
