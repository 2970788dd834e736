"""Attention over a packed row without a (T x T) mask: each sequence of the row attends only to itself.

Remove-padding lays the valid tokens of a micro-batch end to end in one (1, T) row. Telling the
model where each sequence starts with a dense block-diagonal mask costs T^2 memory and time; here
the boundaries travel as cumulative sequence lengths (`cu_seq_lens_q/k`, `max_length_q/k`: the
names transformers' flash-attention path reads) through the model's forward kwargs down to the
attention function, which runs causal attention per segment, so the cost is linear in the number
of sequences of a given length.

How it plugs in: `varlen_implementation(inner)` registers, with transformers' `AttentionInterface`
and `AttentionMaskInterface`, a name that wraps the model's own implementation (`sdpa`, a
flash-attention one...): a call that carries `cu_seq_lens_q` (or packed `position_ids` and no
mask) runs the varlen kernel; any other call (padded rows with a 2-D mask, generation with a KV
cache) goes to the wrapped implementation unchanged. The name stays on the model, so a
gradient-checkpointing recompute in backward takes the same path as the forward did.

The kernel is picked by device type from `VARLEN_KERNELS`: SDPA per segment (`is_causal`) on CPU,
flash-attention's `flash_attn_varlen_func` on CUDA when the `flash_attn` package is installed
(SDPA per segment otherwise). Grouped-query attention (fewer key/value heads) is supported.
Under Ulysses sequence parallelism (rlkit/workers/ulysses.py) the kwargs also carry the group:
the local (sequence slice, all heads) q/k/v become (whole sequence, a share of the heads) by an
all-to-all before the kernel, and the output goes back the same way.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from rlkit.workers import ulysses

PREFIX = "rlkit_varlen_"

#: (q (T,H,d), k (T,Hkv,d), v (T,Hkv,d), cu_seqlens (n+1,) int32, max_len, scale, dropout) -> out (T,H,d)
VarlenKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float, float], torch.Tensor]


@torch.compiler.disable  # a Python loop over data-dependent bounds: eager inside a compiled layer (layer_compile.py)
def sdpa_per_segment(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_len: int,
    scale: float,
    dropout: float,
) -> torch.Tensor:
    """Causal SDPA on each segment `[cu[i], cu[i+1])`: memory O(longest segment), time O(sum of squares)."""
    bounds = cu_seqlens.tolist()
    gqa = q.shape[1] != k.shape[1]
    flash = _cpu_flash(q, max_len)
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (H, L, d)
        if flash:  # (1, H, L, d) takes torch's CPU flash kernel; 3-D input takes the math path
            qs, ks, vs = qs[None], ks[None], vs[None]
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, dropout_p=dropout, enable_gqa=gqa)
        outs.append((out[0] if flash else out).transpose(0, 1))
    return torch.cat(outs, 0) if outs else q.new_zeros(q.shape)


#: bf16/fp16 segments up to this length train faster on the math path (its backward beats the CPU flash kernel's)
MATH_PATH_MAX_LEN = 512


def _cpu_flash(q: torch.Tensor, max_len: int) -> bool:
    """Whether torch's CPU flash kernel runs the segments. Measured on an AVX512-BF16 EPYC, 9 heads of 64
    (docs/performance.md): without gradients it is 1.4-2.8x faster than the math path at every length; with
    gradients it is faster in float32, and in bf16 from ~600 tokens (below, the math path's backward wins by up
    to 1.5x). Long segments always take it: the math path stores (H, L, L) probabilities for the backward."""
    needs_grad = torch.is_grad_enabled() and q.requires_grad
    return not needs_grad or q.dtype == torch.float32 or max_len > MATH_PATH_MAX_LEN


def cuda_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_len: int,
    scale: float,
    dropout: float,
) -> torch.Tensor:
    """flash-attention's varlen kernel (GQA native) when installed; SDPA per segment otherwise."""
    if importlib.util.find_spec("flash_attn") is None:
        return sdpa_per_segment(q, k, v, cu_seqlens, max_len, scale, dropout)
    from flash_attn import flash_attn_varlen_func

    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    return flash_attn_varlen_func(
        q, k, v, cu, cu, max_len, max_len, dropout_p=dropout, softmax_scale=scale, causal=True
    )



#: device type -> its kernel
VARLEN_KERNELS: dict[str, VarlenKernel] = {"cpu": sdpa_per_segment, "mps": sdpa_per_segment,
                                           "xpu": sdpa_per_segment, "cuda": cuda_varlen}


def segments_from_positions(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """cu_seqlens of a packed (1, T) row whose positions restart (or jump) where a new sequence begins."""
    pos = position_ids.reshape(-1)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[1:] = pos[1:] != pos[:-1] + 1
    idx = torch.nonzero(starts).flatten()
    cu = torch.cat([idx, idx.new_tensor([pos.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def _varlen_call(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: torch.Tensor,
    max_len: int,
    scaling: float | None,
    dropout: float,
    group: Any,
) -> torch.Tensor:
    """(1, H, T, d) q/k/v (T local under SP) -> (1, T, H, d), the layout transformers' attention functions return."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, d)
    if group is not None:
        q, k, v = ulysses.heads_to_sequence(q, k, v, group)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    kernel = VARLEN_KERNELS.get(q.device.type, sdpa_per_segment)
    out = kernel(q, k, v, cu, max_len, scale, dropout if module.training else 0.0)
    if group is not None:
        out = ulysses.sequence_to_heads(out, group)
    return out.unsqueeze(0)


def _make_attention(inner: str) -> Callable[..., tuple[torch.Tensor, None]]:
    def varlen_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        cu = kwargs.get("cu_seq_lens_q")
        if cu is not None:
            max_len = int(kwargs.get("max_length_q") or int((cu[1:] - cu[:-1]).max()))
            return _varlen_call(
                module, query, key, value, cu, max_len, scaling, dropout, kwargs.get(ulysses.GROUP_KWARG)
            ), None
        position_ids = kwargs.get("position_ids")
        if attention_mask is None and position_ids is not None and query.shape[0] == 1 and query.shape[2] > 1:
            cu, max_len = segments_from_positions(position_ids)  # packed by the caller without explicit bounds
            return _varlen_call(module, query, key, value, cu, max_len, scaling, dropout, None), None
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS[inner](
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )

    return varlen_attention_forward


def _make_mask(inner: str) -> Callable[..., Any]:
    def varlen_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """No 2-D mask (a packed row, or unpadded rows): no 4-D mask either, the attention handles causality."""
        if attention_mask is None:
            return None
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        return ALL_MASK_ATTENTION_FUNCTIONS[inner](*args, attention_mask=attention_mask, **kwargs)

    return varlen_mask


def varlen_implementation(inner: str) -> str | None:
    """The registered name wrapping `inner` (registered on first use), or None when `inner` is not a function of
    transformers' AttentionInterface (e.g. `eager`, whose function is each model's own)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    if inner.startswith(PREFIX):
        return inner
    if (
        inner not in ALL_ATTENTION_FUNCTIONS._global_mapping
        or inner not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    ):
        return None
    name = PREFIX + inner
    if name not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(name, _make_attention(inner))
        AttentionMaskInterface.register(name, _make_mask(inner))
    return name


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the varlen path cannot serve this model (it then packs with the dense block-diagonal mask), or None."""
    config = model.config
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    if can_set is None or not can_set():
        return f"{type(model).__name__} does not pick its attention from transformers' AttentionInterface"
    if varlen_implementation(config._attn_implementation) is None:
        return f"attn_implementation={config._attn_implementation} has no mask-free wrapper"
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return "sliding-window attention layers"
    if getattr(config, "attn_logit_softcapping", None):
        return "attention logit soft-capping"
    return None


def enable(model: torch.nn.Module) -> str | None:
    """Switch `model` to the wrapping implementation; returns why not (the model is left as it was) or None."""
    reason = unsupported_reason(model)
    if reason is None:
        model.config._attn_implementation = varlen_implementation(model.config._attn_implementation)
    return reason


def packed_kwargs(cu_seqlens: torch.Tensor, max_len: int) -> dict[str, Any]:
    """The forward kwargs that carry a packed row's sequence boundaries to the attention function."""
    return {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": max_len, "max_length_k": max_len}
