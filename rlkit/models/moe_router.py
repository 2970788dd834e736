"""What the routers of a mixture-of-experts model decided in one forward: the load-balancing loss and the
expert-load metrics, read through forward hooks so no model's forward is copied or patched.

A router here is a module returning `(router_logits (N, E), scores, indices (N, k))` from hidden states
flattened to N tokens (transformers 5's `*TopKRouter`, e.g. Qwen3-MoE, Mixtral, OLMoE). Padding tokens
also pass through the routers; the token mask comes from the top module's 2-D `attention_mask` (a packed
forward with a 4-D block mask has no padding), so neither the loss nor the metrics count them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


def is_router(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    experts = getattr(module, "num_experts", None)
    return (
        hasattr(module, "top_k") and isinstance(experts, int) and isinstance(weight, torch.nn.Parameter)
        and weight.dim() == 2 and weight.shape[0] == experts
    )


class RouterTap:
    """Records each router's logits and chosen experts while `recording()` is open."""

    def __init__(self, model: torch.nn.Module, routers: list[torch.nn.Module]) -> None:
        self.routers = routers
        self.num_experts = int(routers[0].num_experts)
        self.top_k = int(routers[0].top_k)
        self._on = False
        self._mask: torch.Tensor | None = None
        self.logits: list[torch.Tensor] = []
        self.indices: list[torch.Tensor] = []
        model.register_forward_pre_hook(self._take_mask, with_kwargs=True)
        for router in routers:
            router.register_forward_hook(self._record)

    @classmethod
    def attach(cls, model: torch.nn.Module) -> RouterTap | None:
        """A tap on every router of `model`, or None for a dense model."""
        routers = [m for m in model.modules() if is_router(m)]
        return cls(model, routers) if routers else None

    def _take_mask(self, module: Any, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask")
        self._mask = mask.reshape(-1).bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    def _record(self, module: Any, args: tuple, output: Any) -> None:
        if not self._on:
            return
        logits, _, indices = output
        if self._mask is not None and self._mask.numel() == logits.shape[0]:
            keep = self._mask.to(logits.device)
            logits, indices = logits[keep], indices[keep]
        self.logits.append(logits)
        self.indices.append(indices)

    @contextlib.contextmanager
    def recording(self) -> Iterator[RouterTap]:
        self.logits, self.indices, self._on = [], [], True
        try:
            yield self
        finally:
            self._on = False

    def load_balancing_loss(self) -> torch.Tensor:
        """E * sum_e (share of the tokens' top-k slots routed to e) * (mean router probability of e), over the
        tokens of every layer (= top_k when perfectly balanced); differentiable in the router weights."""
        logits = torch.cat(self.logits)
        probs = torch.softmax(logits.float(), dim=-1)
        chosen = torch.nn.functional.one_hot(torch.cat(self.indices), self.num_experts).float()  # (N, k, E)
        tokens_per_expert = chosen.sum(dim=1).mean(dim=0)  # (E,)
        return self.num_experts * (tokens_per_expert * probs.mean(dim=0)).sum()

    def load_metrics(self) -> dict[str, float]:
        """Per layer, then averaged: the busiest expert's load over the mean load, and the share of experts that
        received no token."""
        ratios, unused = [], []
        for indices in self.indices:
            counts = torch.bincount(indices.reshape(-1), minlength=self.num_experts).float()
            ratios.append(float(counts.max() / counts.mean().clamp(min=1e-9)))
            unused.append(float((counts == 0).float().mean()))
        if not ratios:
            return {}
        return {"moe/expert_load_max_over_mean": sum(ratios) / len(ratios),
                "moe/dropped_or_unused_experts": sum(unused) / len(unused)}
