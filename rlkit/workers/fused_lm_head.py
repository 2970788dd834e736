"""Fused chunked LM head: `log p(label)` (and entropy, sum_v p_v^2) from hidden states without keeping (T x V) logits.

Why: the naive path materialises the LM head's logits for every response token and autograd keeps
them (and their float32 copies) for backward: T x V x 4 bytes, 1.6 GB for 8k tokens of a 49k vocab.
Here the logits exist one chunk of rows at a time, in float32, in forward and again in backward
(recomputed), so what autograd keeps is the hidden states (T x H), the head weight (already resident)
and two floats per token.

`LM_HEAD_KERNELS` maps a device type to the implementation used there; every device gets the
chunked torch one below (the entry for "cpu", the fallback for any device type without an entry).
Seam for a maintained kernel: add a function with the same signature under "cuda". Liger's
`LigerFusedLinearCrossEntropyFunction` is the candidate, but as of this writing it returns no
entropy (nor sum_v p_v^2, which the optimal token baselines read), and its per-token (`reduction="none"`)
backward was wrong before Liger PR #1298 (every token's gradient scaled by the first token's upstream grad), so
it needs a version check and those terms before it can stand in. liger-kernel is CUDA/Triton-only: not installed
in the CPU env.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch


class HeadStats(NamedTuple):
    """Per row, float32: log p(label) (with grad), and when asked the entropy (with grad) and sum_v p_v^2 (no grad;
    the optimal token baseline's energy term, read from the no-grad old-log-prob forward)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


# (hidden (T, H), weight (V, H), bias (V,) | None, labels (T,), temperature, chunk_size, with_entropy,
#  with_sum_pi_squared) -> HeadStats
LMHeadKernel = Callable[..., HeadStats]


def _row_chunks(rows: int, chunk_size: int) -> list[slice]:
    step = chunk_size if chunk_size > 0 else max(rows, 1)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """The head on one chunk of rows in the compute dtype (as nn.Linear would), upcast to float32, / temperature."""
    z = torch.nn.functional.linear(h, weight, bias).float()
    return z / temperature if temperature != 1.0 else z


class ChunkedLMHeadLogProb(torch.autograd.Function):
    """log_softmax(h W^T + b)/t [label], the softmax entropy and sum_v p_v^2, per row, chunked over rows in both passes.

    sum_v p_v^2 is an output without gradient (it is only read from the no-grad scoring forward).
    Gradients (z = logits / t, p = softmax(z), E = sum p z): d logp/dz = onehot(label) - p and
    d H/dz = -p (z - E); the chain rule through `/ t` and the linear layer gives dh, dW, db.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
    ):
        rows = hidden.shape[0]
        log_probs = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else log_probs.new_empty(0)
        mean_z = torch.empty_like(log_probs) if with_entropy else log_probs.new_empty(0)
        sum_p2 = torch.empty_like(log_probs) if with_sum_pi_squared else log_probs.new_empty(0)
        labels = labels.long()
        for sl in _row_chunks(rows, chunk_size):
            z = _chunk_logits(hidden[sl], weight, bias, temperature)
            lse[sl] = torch.logsumexp(z, dim=-1)
            log_probs[sl] = z.gather(-1, labels[sl, None]).squeeze(-1) - lse[sl]
            if with_entropy or with_sum_pi_squared:
                p = torch.softmax(z, dim=-1)  # the naive path's ops: the same entropy to the bit
                if with_entropy:
                    mean_z[sl] = (p * z).sum(-1)
                    entropy[sl] = lse[sl] - mean_z[sl]
                if with_sum_pi_squared:
                    sum_p2[sl] = p.square().sum(-1)
                del p
            del z
        ctx.save_for_backward(hidden, weight, bias, labels, lse, mean_z)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.mark_non_differentiable(sum_p2)
        return log_probs, entropy, sum_p2

    @staticmethod
    def backward(ctx: Any, grad_lp: torch.Tensor | None, grad_ent: torch.Tensor | None, _grad_p2: Any = None):
        hidden, weight, bias, labels, lse, mean_z = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        use_ent = ctx.with_entropy and grad_ent is not None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        if grad_lp is None:
            grad_lp = torch.zeros_like(lse)
        t = ctx.temperature
        for sl in _row_chunks(hidden.shape[0], ctx.chunk_size):
            z = _chunk_logits(hidden[sl], weight, bias, t)
            p = z.sub(lse[sl, None]).exp_()  # one (rows x V) buffer besides z
            # grad wrt z: g_lp (onehot - p) + g_ent (-p (z - E)), built in place on z's buffer
            coef = grad_lp[sl, None]
            if use_ent:
                z.sub_(mean_z[sl, None]).mul_(grad_ent[sl, None]).add_(coef)
                g = z.mul_(p).neg_()
            else:
                g = p.mul_(coef).neg_()
            g.scatter_add_(-1, labels[sl, None], grad_lp[sl, None])
            if t != 1.0:
                g.div_(t)
            del p
            g_w = g.to(weight.dtype)  # the matmuls in the compute dtype, as the plain head's backward runs them
            if need_h:
                grad_h[sl] = g_w @ weight
            if need_w:  # summed over chunks in float32
                h = hidden[sl].to(weight.dtype)
                if weight.dtype == grad_w.dtype:
                    grad_w.addmm_(g_w.t(), h)
                else:
                    grad_w.add_(g_w.t() @ h)
            if need_b:
                grad_b += g.sum(0)
            del g, z
        return (
            grad_h,
            grad_w.to(weight.dtype) if need_w else None,
            grad_b.to(bias.dtype) if need_b else None,
            None,
            None,
            None,
            None,
            None,
        )


def chunked_lm_head_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
) -> HeadStats:
    """Per-row `log p(label)` (T,) and, if asked, the entropy and sum_v p_v^2 (T,), all float32."""
    lp, ent, p2 = ChunkedLMHeadLogProb.apply(
        hidden, weight, bias, labels, float(temperature), int(chunk_size), bool(with_entropy),
        bool(with_sum_pi_squared),
    )
    return HeadStats(lp, ent if with_entropy else None, p2 if with_sum_pi_squared else None)



#: device type -> its kernel; a device without one gets the chunked kernel
LM_HEAD_KERNELS: dict[str, LMHeadKernel] = {"cpu": chunked_lm_head_logprob}


def fused_lm_head_logprob(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
) -> HeadStats:
    """The kernel of `hidden`'s device type (the chunked torch one where none is)."""
    kind = hidden.device.type
    kernel = LM_HEAD_KERNELS.get(kind, chunked_lm_head_logprob)
    return kernel(hidden, weight, bias, labels, temperature, chunk_size, with_entropy, with_sum_pi_squared)


# config attributes of architectures whose forward changes the logits after the LM head (the fused path
# would skip that): Gemma 2/3 soft-capping, Cohere's logit_scale, Granite's logits_scaling
LOGIT_TRANSFORM_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def unfusable_reason(model: torch.nn.Module) -> str | None:
    """Why the fused head cannot stand in for `model`'s LM head, or None when it can."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None:
        return "the model has no output embeddings (get_output_embeddings() is None)"
    if type(head) is not torch.nn.Linear:
        return f"the LM head is a {type(head).__name__}, not a plain nn.Linear (e.g. a LoRA-adapted lm_head)"
    config = getattr(model, "config", None)
    for attr in LOGIT_TRANSFORM_ATTRS:
        value = getattr(config, attr, None)
        if value not in (None, 1, 1.0):
            return f"the model transforms its logits after the head (config.{attr}={value})"
    return None
