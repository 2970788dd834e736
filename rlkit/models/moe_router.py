"""What the routers of a mixture-of-experts model decided in one forward: the load-balancing loss and the
expert-load metrics, read through forward hooks so no model's forward is copied or patched; and routing
replay: the same hooks can replace a router's choice with given experts (the ones the rollout engine chose).

A router here is a module returning `(router_logits (N, E), scores, indices (N, k))` from hidden states
flattened to N tokens (transformers 5's `*TopKRouter`, e.g. Qwen3-MoE, Mixtral, OLMoE). Padding tokens
also pass through the routers; the token mask comes from the top module's 2-D `attention_mask` (a packed
forward with a 4-D block mask has no padding), so neither the loss nor the metrics count them.

Routing replay (`actor_rollout_ref.actor.router_replay`): `replay(routes)` before a forward hands the tap one
(N, layers, k) tensor of expert ids, one row per token the routers will see, in their order; -1 rows keep the
router's own choice. The trainer's forward hands them over as the model input `routed_experts` (`INPUT`,
`inputs()`), selected like the tokens (packed and sliced, or trimmed; rlkit/workers/model_inputs.py).
Each router's output becomes (its logits, scores of the given experts recomputed from those logits the way
that router family normalises them, the given experts), so gradients still reach the router weights.
The scoring rule is declared per router class (`ROUTE_SCORES`); a family without one is refused. The routes
stay in force until the next forward of the top module, so a backward that recomputes checkpointed layers
uses them too.

Rows shared by a tensor-parallel group (rlkit/workers/tensor_parallel.py): every rank of the group runs the routers
on the group's rows. `share_rows(size, rank)` and the per-token input `route_owners` (`OWNERS`: the group rank whose
row each token is, -1 on packing padding) keep each rank's numbers its own: the load metrics count this rank's tokens,
and the load-balancing loss is the mean over the group's ranks of each one's loss on its own tokens — the same value
on every rank of the group (its gradient reaches the replicated activations alike, as the TP split needs), whose
mean over the data-parallel ranks is the mean of every rank's own loss, as without TP.

Capture (verl's R2: the routes of the trainer's own old-log-prob pass, replayed in the update): inside
`capturing()` each forward that was handed `route_positions` (`POSITIONS`: each fed token's (SP rank, row,
column) in its micro-batch, -1 on packing padding) records those positions and every router's chosen experts;
rlkit/workers/route_capture.py puts them back at their rows and columns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from rlkit.errors import UserError
from rlkit.registry import Registry

RouteScorer = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
#: router class name -> scores (N, k) of given experts (N, k) from the router's logits (N, E)
ROUTE_SCORES: Registry[RouteScorer] = Registry("MoE router scoring rule")


def _softmax_gather(logits: torch.Tensor, indices: torch.Tensor, normalise: bool) -> torch.Tensor:
    probs = torch.softmax(logits.float(), dim=-1).gather(-1, indices)
    return probs / probs.sum(dim=-1, keepdim=True) if normalise else probs


@ROUTE_SCORES.register("Qwen3MoeTopKRouter", "Qwen2MoeTopKRouter", "OlmoeTopKRouter", "Qwen3NextTopKRouter")
def _softmax_topk_flagged(router: torch.nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """softmax over all experts (float32), the chosen ones renormalised when `norm_topk_prob`, cast back to the
    logits' dtype (transformers 5's Qwen3-MoE/Qwen2-MoE/OLMoE routers)."""
    return _softmax_gather(logits, indices, bool(router.norm_topk_prob)).to(logits.dtype)


@ROUTE_SCORES.register("MixtralTopKRouter", "MiniMaxTopKRouter")
def _softmax_topk_normalised(router: torch.nn.Module, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """softmax over all experts (float32), the chosen ones always renormalised, kept in float32 (Mixtral)."""
    return _softmax_gather(logits, indices, True)


def is_router(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    experts = getattr(module, "num_experts", None)
    return (
        hasattr(module, "top_k") and isinstance(experts, int) and isinstance(weight, torch.nn.Parameter)
        and weight.dim() == 2 and weight.shape[0] == experts
    )


class RouterTap:
    """Records each router's logits and chosen experts while `recording()` is open; replays given routes."""

    INPUT = "routed_experts"  # the model input it consumes: (rows, tokens, layers, k) expert ids
    POSITIONS = "route_positions"  # (rows, tokens, 3): where each fed token sits, for `capturing()`
    OWNERS = "route_owners"  # (rows, tokens): the TP group rank each token's row belongs to (`share_rows`)
    OWN_CHOICE = -1  # a token's route that keeps the router's own choice

    def __init__(self, model: torch.nn.Module, routers: list[torch.nn.Module]) -> None:
        self.routers = routers
        self.num_experts = int(routers[0].num_experts)
        self.top_k = int(routers[0].top_k)
        self._on = False
        self._mask: torch.Tensor | None = None
        self.logits: list[torch.Tensor] = []
        self.indices: list[torch.Tensor] = []
        self._layer = {id(router): i for i, router in enumerate(routers)}
        self._pending: torch.Tensor | None = None  # routes for the next forward (`replay`)
        self._forced: torch.Tensor | None = None  # routes of the current forward (and its recomputation)
        self._next_positions: torch.Tensor | None = None  # (N, 3) of the next forward (`POSITIONS`)
        self._positions: torch.Tensor | None = None
        self._captured: list[tuple[torch.Tensor, list]] | None = None  # per forward: positions, each layer's
        self._group: tuple[int, int] | None = None  # (size, rank) of a TP group sharing the rows (`share_rows`)
        self._next_owners: torch.Tensor | None = None
        self._owners: torch.Tensor | None = None
        self.owners: list[torch.Tensor] = []  # per recorded router call, with `logits` (only with a group)
        model.register_forward_pre_hook(self._take_mask, with_kwargs=True)
        for router in routers:
            router.register_forward_hook(self._on_router)

    @classmethod
    def attach(cls, model: torch.nn.Module) -> RouterTap | None:
        """A tap on every router of `model`, or None for a dense model."""
        routers = [m for m in model.modules() if is_router(m)]
        return cls(model, routers) if routers else None

    def replay(self, routes: torch.Tensor) -> None:
        """Force the experts of the next forward: `routes` (N tokens, layers, k) long, -1 = the router's own."""
        if routes.dim() != 3 or routes.shape[1:] != (len(self.routers), self.top_k):
            raise ValueError(f"routes {tuple(routes.shape)} must be (tokens, {len(self.routers)} layers, "
                             f"top_k {self.top_k})")
        for router in self.routers:  # refuse a family with no declared scoring rule before any forward
            _scorer(router)
        self._pending = routes.long()

    def inputs(self) -> dict[str, Callable[[torch.Tensor], None]]:
        """The model inputs this tap consumes, by name: the forward hands each its per-token value."""
        return {self.INPUT: self.replay_rows, self.POSITIONS: self._take_positions, self.OWNERS: self._take_owners}

    def share_rows(self, size: int, rank: int) -> None:
        """The routers run on the rows of a group of `size` ranks, this one `rank`: each forward is handed the
        tokens' owners (`OWNERS`), and the loss and metrics keep to them (see the module docstring)."""
        self._group = (size, rank)

    def _take_owners(self, owners: torch.Tensor) -> None:
        self._next_owners = owners.reshape(-1)

    def _take_positions(self, positions: torch.Tensor) -> None:
        self._next_positions = positions.reshape(-1, positions.shape[-1])

    def replay_rows(self, routes: torch.Tensor) -> None:
        """`replay` of (rows, tokens, layers, k) routes selected as the tokens fed to the next forward (row-major
        is the routers' token order)."""
        self.replay(routes.flatten(0, 1))

    def _take_mask(self, module: Any, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask")
        self._mask = mask.reshape(-1).bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        self._forced, self._pending = self._pending, None
        self._positions, self._next_positions = self._next_positions, None
        self._owners, self._next_owners = self._next_owners, None
        if self._captured is not None and self._positions is not None:
            self._captured.append((self._positions, [None] * len(self.routers)))

    def _on_router(self, module: Any, args: tuple, output: Any) -> Any:
        if self._forced is not None:
            output = self._force(module, output)
        if self._on:
            self._record(output)
        if self._captured and self._positions is not None:
            self._captured[-1][1][self._layer[id(module)]] = output[2].detach()
        return output

    @contextlib.contextmanager
    def capturing(self) -> Iterator[list[tuple[torch.Tensor, list]]]:
        """Per forward given `route_positions` while open: (positions (N, 3), each router's experts (N, k))."""
        self._captured = []
        try:
            yield self._captured
        finally:
            self._captured = None

    def _force(self, router: Any, output: tuple) -> tuple:
        logits, _, own = output
        assert self._forced is not None
        routes = self._forced[:, self._layer[id(router)]].to(own.device)
        if routes.shape[0] != own.shape[0]:
            raise RuntimeError(f"routing replay: {routes.shape[0]} routed tokens for a router that sees "
                               f"{own.shape[0]}; the routes must be selected like the tokens (packed or trimmed)")
        indices = torch.where(routes >= 0, routes, own)
        return logits, _scorer(router)(router, logits, indices), indices

    def _record(self, output: tuple) -> None:
        logits, _, indices = output
        owners = self._owners
        if self._group is not None and (owners is None or owners.numel() != logits.shape[0]):
            raise RuntimeError("router tap: rows shared by a group, but no owner for each routed token")
        if self._mask is not None and self._mask.numel() == logits.shape[0]:
            keep = self._mask.to(logits.device)
            logits, indices = logits[keep], indices[keep]
            owners = owners[keep.to(owners.device)] if owners is not None else None
        self.logits.append(logits)
        self.indices.append(indices)
        if self._group is not None:
            self.owners.append(owners.to(logits.device))

    @contextlib.contextmanager
    def recording(self) -> Iterator[RouterTap]:
        self.logits, self.indices, self.owners, self._on = [], [], [], True
        try:
            yield self
        finally:
            self._on = False

    def load_balancing_loss(self) -> torch.Tensor:
        """E * sum_e (share of the tokens' top-k slots routed to e) * (mean router probability of e), over the
        tokens of every layer (= top_k when perfectly balanced); differentiable in the router weights. With rows
        shared by a group: the mean over its ranks of that loss on each one's tokens."""
        logits, indices = torch.cat(self.logits), torch.cat(self.indices)
        if self._group is None:
            return self._balance(logits, indices)
        owners = torch.cat(self.owners)
        parts = [self._balance(logits[owners == r], indices[owners == r]) for r in range(self._group[0])
                 if bool((owners == r).any())]
        return torch.stack(parts).mean()

    def _balance(self, logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float(), dim=-1)
        chosen = torch.nn.functional.one_hot(indices, self.num_experts).float()  # (N, k, E)
        tokens_per_expert = chosen.sum(dim=1).mean(dim=0)  # (E,)
        return self.num_experts * (tokens_per_expert * probs.mean(dim=0)).sum()

    def load_metrics(self) -> dict[str, float]:
        """Per layer, then averaged: the busiest expert's load over the mean load, and the share of experts that
        received no token (this rank's tokens, with rows shared by a group)."""
        ratios, unused = [], []
        own = [o == self._group[1] for o in self.owners] if self._group is not None else [None] * len(self.indices)
        for indices, mine in zip(self.indices, own, strict=True):
            indices = indices[mine] if mine is not None else indices
            counts = torch.bincount(indices.reshape(-1), minlength=self.num_experts).float()
            ratios.append(float(counts.max() / counts.mean().clamp(min=1e-9)))
            unused.append(float((counts == 0).float().mean()))
        if not ratios:
            return {}
        return {"moe/expert_load_max_over_mean": sum(ratios) / len(ratios),
                "moe/dropped_or_unused_experts": sum(unused) / len(unused)}


def _scorer(router: torch.nn.Module) -> RouteScorer:
    name = type(router).__name__
    if name not in ROUTE_SCORES:
        raise UserError(f"actor_rollout_ref.actor.router_replay: no scoring rule declared for the router {name}; "
                        f"add its class name to a rule in rlkit/models/moe_router.py (ROUTE_SCORES: "
                        f"{', '.join(ROUTE_SCORES.names())}) after checking how its forward turns logits into "
                        "scores, or set router_replay=false")
    return ROUTE_SCORES.get(name)


class RouteRecorder:
    """The experts every router chose in each forward of `model`, unmasked and in call order, while `recording()`
    is open: what a generating engine (the hf rollout) records for routing replay. `take()` returns one
    (tokens of that forward, layers, k) tensor per forward (prefill, then one per decode step)."""

    def __init__(self, routers: list[torch.nn.Module]) -> None:
        self.routers = routers
        self.top_k = int(routers[0].top_k)
        self.num_experts = int(routers[0].num_experts)
        self._on = False
        self._calls: list[list[torch.Tensor]] = [[] for _ in routers]
        for i, router in enumerate(routers):
            router.register_forward_hook(lambda module, args, output, i=i: self._record(i, output))

    @classmethod
    def attach(cls, model: torch.nn.Module) -> RouteRecorder | None:
        """A recorder on every router of `model`, or None for a dense model."""
        routers = [m for m in model.modules() if is_router(m)]
        return cls(routers) if routers else None

    def _record(self, layer: int, output: Any) -> None:
        if self._on:
            self._calls[layer].append(output[2].detach())

    @contextlib.contextmanager
    def recording(self) -> Iterator[RouteRecorder]:
        self._calls, self._on = [[] for _ in self.routers], True
        try:
            yield self
        finally:
            self._on = False

    def take(self) -> list[torch.Tensor]:
        """Per forward: (N, layers, k) long, layer order = the routers' module order (as `RouterTap`'s)."""
        calls = [torch.stack(per_layer, dim=1) for per_layer in zip(*self._calls, strict=True)]
        self._calls = [[] for _ in self.routers]
        return calls
