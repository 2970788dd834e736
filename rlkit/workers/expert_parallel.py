"""Expert parallel: each rank of an expert-parallel (EP) group holds `experts / ep` of every MoE layer's experts and
computes, at each forward, every token routed to them (issue 46; torchtitan's all-to-all dispatch is the model).

A plan per model family (`EXPERT_PLANS`, looked up by the HF config's `model_type`) names the fused experts modules
(transformers 5 keeps a layer's experts as one module: `gate_up_proj` (E, 2I, H), `down_proj` (E, H, I),
`forward(hidden (N, H), top_k_index (N, k), top_k_weights (N, k)) -> (N, H)`). Placing a plan:
- each fused weight becomes a DTensor on the 1-D EP mesh, `Shard(0)` (the experts), so FSDP2 shards it further over
  the data-parallel ranks outside the group and `full_tensor()` (weight sync, export) and DCP see the whole weight;
- the module's forward becomes a dispatch around its own: the (token, k) assignments are ordered by the rank holding
  their expert, the counts exchanged, the hidden rows sent there by an autograd-aware all-to-all; the module's own
  forward runs on what arrived with its local weight slice (local expert ids, unit weights, `num_experts` the local
  count); the outputs come back by the reverse all-to-all, weighted by `top_k_weights` and summed per token.
The router is untouched: the router tap (rlkit/models/moe_router.py: load-balancing loss, load metrics, routing
replay) sees exactly what it sees without EP. Every rank of a group runs the same forwards (the micro-batch counts
agree across data-parallel ranks, rlkit/workers/micro_batch.py), recomputed checkpointed layers included, so the
collectives pair up.

Gradients: an expert's gradient on its rank collects, through the all-to-all's backward, the contributions of every
EP rank's tokens; FSDP2 then reduces over the `dp / ep` ranks holding the same experts. Without EP every data-parallel
rank's gradient is averaged over `dp` ranks, so the experts' FSDP2 unit divides by `dp` (not its own `dp / ep`
ranks): the same mean (`fsdp_model._place`).
A new family whose experts module has this shape: `@EXPERT_PLANS.register("<model_type>")` on a function returning
{dotted name: experts module}.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlkit.errors import UserError
from rlkit.registry import Registry

ExpertPlan = Callable[[torch.nn.Module], dict[str, torch.nn.Module]]
EXPERT_PLANS: Registry[ExpertPlan] = Registry("expert-parallel plan (by the model's config.model_type)")
FUSED_WEIGHTS = ("gate_up_proj", "down_proj")  # dim 0 = the experts


@EXPERT_PLANS.register("qwen3_moe", "mixtral", "qwen2_moe", "olmoe")
def fused_experts_plan(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every `mlp.experts` module holding the fused weights (a Qwen2-MoE's shared expert is a dense MLP beside them:
    it stays whole, data-parallel)."""
    return {name: module for name, module in model.named_modules()
            if name.endswith("mlp.experts") and all(isinstance(getattr(module, w, None), torch.nn.Parameter)
                                                    for w in FUSED_WEIGHTS)}


@dataclass(frozen=True)
class ExpertParallel:
    """The EP group of this rank and the experts modules placed over it."""

    size: int
    rank: int  # within the group
    group: Any
    mesh: Any  # the 1-D EP device mesh
    modules: tuple[torch.nn.Module, ...]


def parallelize(model: torch.nn.Module, ep_mesh: Any) -> ExpertParallel:
    """Split the experts of `model` over `ep_mesh` (1-D) by its family's plan, before FSDP2 shards them over the
    remaining data-parallel ranks (every rank holds the whole loaded weights: each keeps its slice)."""
    from torch.distributed.tensor import DTensor, Shard

    ep, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    model_type = model.config.model_type
    if model_type not in EXPERT_PLANS:
        raise UserError(f"fsdp_config.expert_parallel_size={ep}: no expert-parallel plan for model_type "
                        f"'{model_type}' (plans: {', '.join(EXPERT_PLANS)}); use expert_parallel_size=1")
    modules = EXPERT_PLANS.get(model_type)(model)
    if not modules:
        raise UserError(f"fsdp_config.expert_parallel_size={ep}: the model has no experts to split; use 1")
    group = ep_mesh.get_group()
    for module in modules.values():
        total = int(module.num_experts)
        if total % ep:
            raise UserError(f"fsdp_config.expert_parallel_size={ep} must divide the model's {total} experts")
        for name in FUSED_WEIGHTS:
            full = getattr(module, name)
            local = full.detach().chunk(ep, dim=0)[rank].clone()
            setattr(module, name, torch.nn.Parameter(
                DTensor.from_local(local, ep_mesh, [Shard(0)], shape=full.shape, stride=full.stride()),
                requires_grad=full.requires_grad))
        module.forward = types.MethodType(_dispatching_forward(type(module).forward, ep, group), module)
    return ExpertParallel(ep, rank, group, ep_mesh, tuple(modules.values()))


def _dispatching_forward(own_forward: Callable, ep: int, group: Any) -> Callable:
    """The experts module's forward over its EP group, around `own_forward` (the module class's)."""

    def forward(module: torch.nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        local_count = int(module.num_experts) // ep
        arrived, local_ids, route = _dispatch(hidden, top_k_index, local_count, ep, group)
        weights = {name: _local(getattr(module, name)) for name in FUSED_WEIGHTS}
        with _LocalView(module, weights, local_count):
            out = own_forward(module, arrived, local_ids[:, None], arrived.new_ones(arrived.shape[0], 1))
        # every local weight in the graph, so a rank that received no token still hands FSDP2 a (zero) gradient
        out = out + sum(w.sum() for w in weights.values()) * 0.0
        return route.combine(out, top_k_weights)

    return forward


def _local(weight: torch.Tensor) -> torch.Tensor:
    return weight.to_local() if hasattr(weight, "to_local") else weight


class _LocalView:
    """The module's fused weights and expert count replaced by this rank's slice for one call of its own forward."""

    def __init__(self, module: torch.nn.Module, weights: dict[str, torch.Tensor], count: int) -> None:
        self.module, self.weights, self.count = module, weights, count

    def __enter__(self) -> None:
        self.saved = {name: self.module._parameters[name] for name in self.weights}
        self.saved_count = self.module.num_experts
        for name, weight in self.weights.items():
            self.module._parameters[name] = weight  # a plain tensor carrying the slice's autograd
        self.module.num_experts = self.count

    def __exit__(self, *exc: Any) -> None:
        self.module._parameters.update(self.saved)
        self.module.num_experts = self.saved_count


@dataclass
class _Route:
    """Where this rank's (token, k) assignments went, to bring their outputs back and sum them per token."""

    order: torch.Tensor  # assignment positions sorted by destination rank
    sent: list[int]  # rows sent to each rank
    received: list[int]  # rows received from each rank
    tokens: int
    top_k: int
    group: Any

    def combine(self, out: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """The arrived rows' outputs back to their ranks, weighted and summed into (tokens, H)."""
        back = _exchange(out, self.sent, self.received, self.group)
        per_slot = torch.empty_like(back).index_copy(0, self.order, back)  # (tokens * k, H) in (token, k) order
        weighted = per_slot.view(self.tokens, self.top_k, -1) * top_k_weights[..., None].to(per_slot.dtype)
        return weighted.sum(dim=1).to(out.dtype)


def _dispatch(hidden: torch.Tensor, top_k_index: torch.Tensor, local_count: int, ep: int,
              group: Any) -> tuple[torch.Tensor, torch.Tensor, _Route]:
    """The rows routed to this rank's experts (from every rank of the group), their local expert ids, the route."""
    tokens, top_k = top_k_index.shape
    experts = top_k_index.reshape(-1)
    destination = torch.div(experts, local_count, rounding_mode="floor")
    order = torch.sort(destination, stable=True).indices
    sent_t = torch.bincount(destination, minlength=ep)
    received_t = torch.empty_like(sent_t)
    dist.all_to_all_single(received_t, sent_t, group=group)
    sent, received = sent_t.tolist(), received_t.tolist()
    rows = hidden[torch.div(order, top_k, rounding_mode="floor")]
    arrived = _exchange(rows, received, sent, group)
    ids = experts[order] - destination[order] * local_count
    local_ids = ids.new_empty(sum(received))
    dist.all_to_all_single(local_ids, ids, output_split_sizes=received, input_split_sizes=sent, group=group)
    return arrived, local_ids, _Route(order, sent, received, tokens, top_k, group)


def _exchange(rows: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
    """An all-to-all of rows (`in_splits` sent to each rank, `out_splits` received) whose backward is the reverse
    all-to-all of the gradients (functional collectives: autograd-aware, on gloo too)."""
    import torch.distributed._functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_to_all_single_autograd(rows.contiguous(), out_splits, in_splits, group))
