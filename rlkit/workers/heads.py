"""What sits on top of the model in `FSDPModel.forward`, chosen once at construction: a head strategy.

`LogProbHead` (the policy): log-probs (and entropy) of the response tokens, from the plain LM head or the fused
chunked one (rlkit/workers/log_prob_head.py; `FusionGate` falls back to the plain head with a logged reason).
`ValueHead` (the critic): the token-classification head's one value per response position.
Each serves both layouts of `FSDPModel.forward`: `padded` (the trimmed rows) and `packed` (one packed row, or
under sequence parallelism this rank's slice of it, rlkit/workers/model_inputs.py). Both return (b, R).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import torch

from rlkit.workers.log_prob_head import FusionGate, head_log_probs
from rlkit.workers.model_inputs import ModelInputs, PackedInputs
from rlkit.workers.packing import response_targets
from rlkit.workers.shape_buckets import pad_rows
from rlkit.workers.tensor_parallel import VocabShard


@dataclass
class ForwardOut:
    log_probs: torch.Tensor | None = None  # (b, R)
    entropy: torch.Tensor | None = None  # (b, R)
    values: torch.Tensor | None = None  # (b, R)
    sum_pi_squared: torch.Tensor | None = None  # (b, R) float32, sum_v pi_v^2 at the log-probs' temperature
    routed_experts: torch.Tensor | None = None  # (b, S, layers, k) captured routes (workers/route_capture.py)

    def rows(self, own: slice) -> ForwardOut:
        return self.map(lambda t: t[own])

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ForwardOut:
        """`fn` on every tensor present."""
        return ForwardOut(**{f.name: None if (t := getattr(self, f.name)) is None else fn(t) for f in fields(self)})


@dataclass(frozen=True)
class HeadCall:
    """One forward's head options (`FSDPModel.forward`'s keywords)."""

    response_length: int
    temperature: float = 1.0
    with_entropy: bool = False
    chunk_size: int = 1024
    response_logits_only: bool = True
    with_sum_pi_squared: bool = False  # sum_v pi_v^2 per token too (the optimal token baselines' energy)
    bucket: int = 1  # the LM head's rows padded to a multiple of this (rlkit/workers/shape_buckets.py)
    wanted: torch.Tensor | None = None  # (b, R) bool: the response positions to score (None: every valid one)


class Head(Protocol):
    def with_fused(self, fused: bool) -> Head: ...

    def padded(self, module: torch.nn.Module, kwargs: dict[str, Any], rows: ModelInputs, call: HeadCall) -> ForwardOut:
        """`rows`: the trimmed inputs that `kwargs` feed the model."""
        ...

    def packed(
        self, module: torch.nn.Module, kwargs: dict[str, Any], rows: ModelInputs, packed: PackedInputs, call: HeadCall
    ) -> ForwardOut:
        """`rows`: the inputs before packing; `packed`: the row (and slice) that `kwargs` feed the model."""
        ...


class ValueHead:
    """The critic's: the model's one logit per position, at the positions that predict the response tokens."""

    def with_fused(self, fused: bool) -> ValueHead:
        return self  # no LM head to fuse

    def padded(self, module: torch.nn.Module, kwargs: dict[str, Any], rows: ModelInputs, call: HeadCall) -> ForwardOut:
        r = call.response_length
        return ForwardOut(values=module(**kwargs).logits[:, -r - 1 : -1, 0].float())

    def packed(
        self, module: torch.nn.Module, kwargs: dict[str, Any], rows: ModelInputs, packed: PackedInputs, call: HeadCall
    ) -> ForwardOut:
        values = module(**kwargs).logits[0, :, 0]  # (hi - lo,)
        per_token = packed.row.unpack(packed.gather(values))  # (b, L)
        return ForwardOut(values=per_token[:, -call.response_length - 1 : -1].float())


@dataclass(frozen=True)
class LogProbHead:
    """The policy's: log p(response token) (and entropy, sum_v pi_v^2), 0 where no response token is predicted.

    `response_logits_only` runs the LM head only where a response token is predicted (the model's
    `logits_to_keep`, when its forward takes it); `fused` (with it) computes them from the hidden states in
    chunks without keeping the logits for backward (rlkit/workers/fused_lm_head.py)."""

    fused: bool
    logits_to_keep: bool  # the model's forward takes `logits_to_keep`
    gate: FusionGate  # shared by `with_fused` copies: the fallback is logged once per model
    vocab: VocabShard | None = None  # tensor parallel: the LM head's logits are this rank's vocabulary slice

    def with_fused(self, fused: bool) -> LogProbHead:
        return self if fused == self.fused else replace(self, fused=fused)

    def _options(self, module: torch.nn.Module, call: HeadCall) -> tuple[bool, dict[str, Any]]:
        keep = call.response_logits_only and self.logits_to_keep
        if self.fused and not keep:
            self.gate.log_unfused("response_logits_only is off or the model takes no logits_to_keep")
        if self.fused and self.vocab is not None:
            self.gate.log_unfused("the LM head is vocabulary-parallel (tensor parallel): its sharded logits are "
                                  "reduced chunk by chunk instead")
        fused = self.fused and keep and self.vocab is None and self.gate.can_fuse(module)
        return keep, dict(temperature=call.temperature, with_entropy=call.with_entropy, chunk_size=call.chunk_size,
                          fused=fused, with_sum_pi_squared=call.with_sum_pi_squared, vocab=self.vocab)

    def padded(self, module: torch.nn.Module, kwargs: dict[str, Any], rows: ModelInputs, call: HeadCall) -> ForwardOut:
        keep, options = self._options(module, call)
        r = call.response_length
        _, resp_need, labels = response_targets(rows.input_ids, rows.attention_mask, r, call.wanted)
        if keep:
            kwargs["logits_to_keep"] = r + 1
            pick = lambda kept: kept[:, :-1][resp_need]  # noqa: E731  (b, R+1, X) -> (K, X)
        else:
            pick = lambda logits: logits[:, -r - 1 : -1][resp_need]  # noqa: E731
        return _scatter(resp_need, *head_log_probs(module, kwargs, pick, labels, **options))

    def packed(
        self, module: torch.nn.Module, kwargs: dict[str, Any], rows: ModelInputs, packed: PackedInputs, call: HeadCall
    ) -> ForwardOut:
        keep, options = self._options(module, call)
        need, resp_need, labels = response_targets(rows.input_ids, rows.attention_mask, call.response_length,
                                                    call.wanted)
        kept = packed.row.index()[need]  # (K,) packed positions whose logits are needed, row-major
        local = (kept >= packed.lo) & (kept < packed.hi)
        at = kept[local] - packed.lo
        count = at.numel()
        rows = pad_rows(at, call.bucket)  # the head's rows in few distinct counts; the repeats are dropped below
        if keep:
            kwargs["logits_to_keep"] = rows
            pick = lambda out: out[0]  # noqa: E731  (1, K_local, X) -> (K_local, X)
        else:
            pick = lambda logits: logits[0, rows]  # noqa: E731
        padded = head_log_probs(module, kwargs, pick, pad_rows(labels[local], call.bucket), **options)
        stats = [None if v is None else v[:count] for v in padded]
        # under SP each rank holds the values at its slice's kept positions: gather the whole row's
        return _scatter(resp_need, *(None if v is None else packed.gather_kept(v, at, kept) for v in stats))


def _scatter(resp_need: torch.Tensor, k_lp: torch.Tensor, k_ent: torch.Tensor | None = None,
             k_p2: torch.Tensor | None = None) -> ForwardOut:
    """(K,) values at the needed response positions -> (b, R), 0 elsewhere."""

    def place(k_values: torch.Tensor | None) -> torch.Tensor | None:
        if k_values is None:
            return None
        full = torch.zeros(resp_need.shape, dtype=torch.float32, device=resp_need.device)
        full[resp_need] = k_values
        return full

    return ForwardOut(log_probs=place(k_lp), entropy=place(k_ent), sum_pi_squared=place(k_p2))


def make_head(value_head: bool, fused_lm_head: bool, logits_to_keep: bool, vocab: VocabShard | None = None) -> Head:
    """The critic's value head, or the policy's log-prob head (`fused_lm_head`: the fused one where it can serve;
    `vocab`: a vocabulary-parallel LM head's slice)."""
    if value_head:
        return ValueHead()
    return LogProbHead(fused=fused_lm_head, logits_to_keep=logits_to_keep, gate=FusionGate(), vocab=vocab)
