"""The policy's forward up to per-token log-probs (and entropy, sum_v pi_v^2): the plain LM head, or the fused one.

`head_log_probs` runs the model with the given inputs and returns `log p(label)` for the rows that
`rows` picks out of what the LM head sees (and, when asked, the entropy and sum_v pi_v^2 of the same
distribution: the logits at the sampling temperature). With `fused`, the model's LM head stands in as the fused
chunked log-prob (rlkit/workers/fused_lm_head.py): it is called inside the top module's forward,
where FSDP2 has gathered the root unit's parameters (the head's weight, tied to the embedding or
not), and its gradient flows through the same unsharded parameter as the plain path's, so sharding
and grad reduction are unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from rlkit.algo.utils import entropy_from_logits, logprobs_from_logits, sum_pi_squared_from_logits
from rlkit.workers.fused_lm_head import HeadStats, fused_lm_head_logprob, unfusable_reason
from rlkit.workers.tensor_parallel import VocabShard
from rlkit.workers.vocab_parallel import vocab_parallel_stats

log = logging.getLogger("rlkit.workers.fsdp_model")  # the warning tests and users look for lives there

Rows = Callable[[torch.Tensor], torch.Tensor]  # what the LM head saw (logits or hidden states) -> (K, X)


def head_log_probs(
    module: torch.nn.Module,
    model_kwargs: dict[str, Any],
    rows: Rows,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
    fused: bool,
    with_sum_pi_squared: bool = False,
    vocab: VocabShard | None = None,
) -> HeadStats:
    """(K,) float32 log-probs of `labels` and, if asked, entropies and sum_v pi_v^2. `vocab`: the LM head's
    logits are this rank's vocabulary slice of a tensor-parallel group's (rlkit/workers/vocab_parallel.py)."""
    if vocab is not None:
        logits = rows(module(**model_kwargs).logits)  # (K, V/tp)
        if temperature != 1.0:
            logits = logits / temperature
        return vocab_parallel_stats(logits, labels, vocab.start, vocab.group, chunk_size, with_entropy,
                                    with_sum_pi_squared)
    if fused:
        return _fused_forward(module, model_kwargs, rows, labels, temperature, with_entropy, chunk_size,
                              with_sum_pi_squared)
    logits = rows(module(**model_kwargs).logits)  # (K, V)
    if temperature != 1.0:
        logits = logits / temperature
    return HeadStats(
        logprobs_from_logits(logits, labels, chunk_size=chunk_size),
        entropy_from_logits(logits, chunk_size=chunk_size) if with_entropy else None,
        sum_pi_squared_from_logits(logits, chunk_size=chunk_size) if with_sum_pi_squared else None,
    )


def _fused_forward(
    module: torch.nn.Module,
    model_kwargs: dict[str, Any],
    rows: Rows,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_size: int,
    with_sum_pi_squared: bool,
) -> HeadStats:
    head = module.get_output_embeddings()
    out: dict[str, HeadStats] = {}

    def fused_head(kept: torch.Tensor) -> torch.Tensor:
        out["stats"] = fused_lm_head_logprob(
            rows(kept), head.weight, head.bias, labels, temperature, chunk_size, with_entropy, with_sum_pi_squared
        )
        return kept.new_zeros((*kept.shape[:-1], 1))  # the "logits" the model returns: unused

    head.forward = fused_head
    try:
        module(**model_kwargs)
    finally:
        del head.forward  # back to the class's forward
    return out["stats"]


class FusionGate:
    """Whether the fused head can serve a model; logs the reason it cannot, once."""

    def __init__(self) -> None:
        self._logged = False

    def can_fuse(self, module: torch.nn.Module) -> bool:
        reason = unfusable_reason(module)
        if reason is not None:
            self.log_unfused(reason)
        return reason is None

    def log_unfused(self, reason: str) -> None:
        if not self._logged:
            log.warning("fused_lm_head: using the plain LM head path (%s)", reason)
            self._logged = True
