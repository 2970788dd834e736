"""One worker computing in bf16 without FSDP2: the model runs on a compute-dtype copy of its fp32 masters.

Why: on a single rank FSDP2's mixed precision has nothing to shard, yet it still casts and copies every
parameter before each micro-batch's forward (and again in backward) and copies every gradient out again. On the
2-core AVX512-BF16 CPU that was ~1.9 s of a 13 s update (docs/performance.md). Here each parameter is cast once
and the copy is reused until its master changes (an optimizer step, a checkpoint load: the master's version
counter says so), so a step pays one cast, and each gradient is added to its fp32 master as soon as backward has
produced it (a post-accumulate hook; the bf16 gradient is freed at once, as FSDP2's reduce frees it).

The arithmetic is FSDP2's: the copy is the master rounded to the compute dtype, the master's gradient is the sum
over micro-batches of the bf16 gradients in float32 (`reduce_dtype` float32), floating-point model inputs (pixel
values) are cast to the compute dtype (FSDP2's `cast_forward_inputs`): tests/workers/test_compute_copy.py finds the
same log-probs, gradients and stepped masters to the bit. One difference: FSDP2 also casts each wrapped block's
floating inputs, where the copy leaves the model's own choices, as a plain bf16 forward does (a Qwen2.5-VL vision
block's fp32 rotary tables stay fp32: image rows' log-probs differ from FSDP2's by ~2e-3). A parameter nothing trains
(`requires_grad` off) of a model without an optimizer (a reference, a teacher) is replaced by its copy for good:
nothing steps it, so its fp32 master would only hold memory.

What it does not cover: gradient checkpointing (the recompute in backward runs after `active()` has put the
masters back; FSDPModel keeps FSDP2 there) and more than one worker (FSDP2 shards).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import torch


def _accumulate(master: torch.nn.Parameter, copy: torch.Tensor) -> None:
    """The copy's gradient (this backward's sum over its uses) into the master's, in the master's dtype."""
    if master.grad is None:
        master.grad = copy.grad.to(master.dtype)
    else:
        master.grad.add_(copy.grad)
    copy.grad = None


class ComputeCopy:
    """The compute-dtype copies of a module's parameters, put in place while the module computes."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype) -> None:
        self.module, self.dtype = module, dtype
        self.replace_frozen = True  # off for a model with an optimizer: its checkpoints keep what was loaded
        self._copies: dict[int, tuple[int, torch.nn.Parameter]] = {}  # id(master) -> (its version when cast, copy)

    def _slots(self) -> list[tuple[torch.nn.Module, str, torch.nn.Parameter]]:
        """(owner, attribute, master) for every floating parameter slot not already in the compute dtype; a tied
        parameter has one slot per owner and one copy."""
        return [
            (owner, name, p)
            for owner in self.module.modules()
            for name, p in owner._parameters.items()
            if p is not None and p.is_floating_point() and p.dtype != self.dtype
        ]

    def _copy(self, master: torch.nn.Parameter) -> torch.nn.Parameter:
        version, copy = self._copies.get(id(master), (-1, None))
        if copy is not None and version == master._version:
            return copy
        if copy is None:
            copy = torch.nn.Parameter(master.detach().to(self.dtype), requires_grad=master.requires_grad)
            if master.requires_grad:
                copy.register_post_accumulate_grad_hook(partial(_accumulate, master))
        else:
            with torch.no_grad():
                copy.copy_(master)
        self._copies[id(master)] = (master._version, copy)
        return copy

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The module computes on the copies inside; the masters are back in place on exit, so state dicts,
        the optimizer and the weight export see them. Autograd graphs built inside keep the copies they used."""
        slots = self._slots()
        for owner, name, master in slots:
            copy = self._copy(master)
            owner._parameters[name] = copy
            if self._stands_in(master):  # frozen: the copy stands in for good (see the module docstring)
                self._copies.pop(id(master), None)
        try:
            yield
        finally:
            for owner, name, master in slots:
                if not self._stands_in(master):
                    owner._parameters[name] = master

    def _stands_in(self, master: torch.nn.Parameter) -> bool:
        return self.replace_frozen and not master.requires_grad

    def cast_inputs(self, value: object) -> object:
        """A floating-point input tensor in the compute dtype (as FSDP2 casts the root module's inputs)."""
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != self.dtype:
            return value.to(self.dtype)
        return value

    def release(self) -> None:
        """Drop the copies of trained parameters (the next `active()` casts again): between calls, the
        memory they hold goes back (the update's peak is where it counts)."""
        self._copies.clear()
