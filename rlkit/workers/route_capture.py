"""The experts the trainer's own forward chose for each token, at the token's row and column: verl's R2 routing
replay (`actor.router_replay_from=old_log_prob`). The old-log-prob pass captures them; the update replays them,
so the update's forwards route every token as the policy that produced `old_log_probs` did, whatever kernel
noise the update's other packing brings near a tie.

A forward packs, trims or (under sequence parallelism) splits its rows, so the tokens the routers see are not
the micro-batch's (rows, columns). Each token carries its place instead: `positions()` is a per-token input
(SP rank, row, column) that travels through the same selection as the tokens (rlkit/workers/model_inputs.py),
and the router tap records it beside the chosen experts (rlkit/models/moe_router.py `capturing`). `routes()`
scatters the records back; under SP each rank sees part of every row of its group, so the group's records are
exchanged first and each rank keeps its own rows'.
"""

from __future__ import annotations

import torch

from rlkit.models.moe_router import RouterTap
from rlkit.workers.model_inputs import TokenInput
from rlkit.workers.ulysses import SequenceParallel

ROUTE_DTYPE = torch.int16  # as the engines return routes (2 bytes per expert id)


def positions(rows: int, columns: int, sp: SequenceParallel | None) -> TokenInput:
    """(rows, columns, 3): this rank's (SP rank, row, column) of each token; -1 where packing pads."""
    rank = sp.rank if sp is not None else 0
    r = torch.arange(rows).view(rows, 1).expand(rows, columns)
    c = torch.arange(columns).view(1, columns).expand(rows, columns)
    value = torch.stack([torch.full_like(r, rank), r, c], dim=-1)
    return TokenInput(value, fill=-1, to_model=False)


def routes(records: list[tuple[torch.Tensor, list]], attention_mask: torch.Tensor, top_k: int,
           sp: SequenceParallel | None) -> torch.Tensor:
    """(rows, columns, layers, k) of the captured forwards' experts, OWN_CHOICE (-1) where no router saw a
    valid token of this rank (padding)."""
    pos = [p.cpu() for p, _ in records]
    experts = [torch.stack([e.cpu() for e in layers], dim=1) for _, layers in records]  # (N, layers, k)
    if sp is not None:
        parts = sp.gather_objects((pos, experts))
        pos = [p for part in parts for p in part[0]]
        experts = [e for part in parts for e in part[1]]
    rows, columns = attention_mask.shape
    layers = experts[0].shape[1] if experts else 0
    out = torch.full((rows, columns, layers, top_k), RouterTap.OWN_CHOICE, dtype=ROUTE_DTYPE)
    rank = sp.rank if sp is not None else 0
    for p, e in zip(pos, experts, strict=True):
        mine = p[:, 0] == rank
        out[p[mine, 1], p[mine, 2]] = e[mine].to(ROUTE_DTYPE)
    out[~attention_mask.bool().cpu()] = RouterTap.OWN_CHOICE
    return out
