"""The full next-token distribution at the response positions, for the losses that read more than the sampled
token (forward_kl_topk: the teacher's top-k ids and log-probs, the student's log-probs at those ids).

One padded forward of the wrapped module (no packing, no fused head): the (b, R, vocab) log-probs exist once per
micro-batch, so callers keep micro-batches small for a large vocabulary.
"""

from __future__ import annotations

import torch


def response_log_softmax(module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, response_length: int, temperature: float) -> torch.Tensor:
    """(b, R, vocab) log-probs of the token at each response position, the logits divided by `temperature`
    (prompt left-padded, response right-padded: position P - 1 + j predicts response token j)."""
    logits = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=False).logits
    start = input_ids.shape[1] - response_length - 1
    return torch.log_softmax(logits[:, start:start + response_length].float() / temperature, dim=-1)
