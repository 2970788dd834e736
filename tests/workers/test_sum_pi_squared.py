"""sum_v pi_v^2 per token from the policy's log-prob head (the optimal token baselines' energy term).

Reference: a plain Hugging Face forward of the same weights, softmax(logits / T)**2 summed over the vocabulary at
each valid response position. Checked (float32, 1e-5) for the fused chunked kernel alone and for `FSDPModel.forward`
with the plain and the fused head, padded and packed, at the sampling temperature, with chunks smaller than the
batch; the log-probs are unchanged by asking for it, and it carries no gradient.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.config.schema import FSDPConfig
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.fused_lm_head import fused_lm_head_logprob
from tests.perf.test_forward_equivalence import RESPONSE, handmade_batch, model_path  # noqa: F401  (fixture)

TEMPERATURE = 0.7


@pytest.mark.parametrize("temperature", [1.0, TEMPERATURE])
def test_fused_kernel_sum_pi_squared_matches_the_softmax(temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g).requires_grad_()
    weight = torch.randn(50, 16, generator=g)
    bias = torch.randn(50, generator=g)
    labels = torch.randint(0, 50, (37,), generator=g)
    stats = fused_lm_head_logprob(hidden, weight, bias, labels, temperature, chunk_size=8, with_sum_pi_squared=True)
    want = torch.softmax((hidden @ weight.T + bias) / temperature, dim=-1).square().sum(-1)
    torch.testing.assert_close(stats.sum_pi_squared, want.detach(), atol=1e-5, rtol=0)
    assert stats.entropy is None and not stats.sum_pi_squared.requires_grad
    plain = fused_lm_head_logprob(hidden, weight, bias, labels, temperature, chunk_size=8)
    assert plain.sum_pi_squared is None
    assert torch.equal(stats.log_probs, plain.log_probs)
    stats.log_probs.sum().backward()  # the extra output does not disturb the backward
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0


def plain_sum_pi_squared(path, batch: dict) -> torch.Tensor:
    """(B, R) from a plain HF forward of the padded batch: softmax(logits / T)**2 summed at response positions."""
    model = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    return torch.softmax(logits[:, -RESPONSE - 1 : -1].float() / TEMPERATURE, dim=-1).square().sum(-1)


def test_forward_returns_sum_pi_squared_on_every_head_and_layout(process_group, model_path):  # noqa: F811
    batch = handmade_batch()
    want = plain_sum_pi_squared(model_path, batch)
    valid = batch["response_mask"].bool()
    model = FSDPModel(str(model_path), FSDPConfig(shard_single_worker=True), torch.device("cpu"))
    args = [batch[k] for k in ("input_ids", "attention_mask", "position_ids")]
    widths: list[int] = []  # last dim of what the LM head returns: the vocab (plain), 1 (fused: no logits)
    model.module.get_output_embeddings().register_forward_hook(lambda m, i, out: widths.append(out.shape[-1]))
    for fused, remove_padding in itertools.product((False, True), (False, True)):
        widths.clear()
        with torch.no_grad():
            out = model.forward(*args, RESPONSE, temperature=TEMPERATURE, with_entropy=True, chunk_size=5,
                                remove_padding=remove_padding, fused_lm_head=fused, with_sum_pi_squared=True)
            without = model.forward(*args, RESPONSE, temperature=TEMPERATURE, chunk_size=5,
                                    remove_padding=remove_padding, fused_lm_head=fused)
        where = f"fused={fused} remove_padding={remove_padding}"
        assert widths == [1 if fused else model.config.vocab_size] * 2, where
        assert out.sum_pi_squared.dtype == torch.float32 and out.sum_pi_squared.shape == valid.shape, where
        torch.testing.assert_close(out.sum_pi_squared[valid], want[valid], atol=1e-5, rtol=0,
                                   msg=lambda m, w=where: w + m)
        assert bool((out.sum_pi_squared[~valid] == 0).all()), where
        assert without.sum_pi_squared is None, where
        torch.testing.assert_close(out.log_probs, without.log_probs, atol=0, rtol=0)
