"""The optimizer a trained role steps, built as its config's `optim` section names it (rlkit.config.optim)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlkit.config.optim import OptimConfig, optimizer_class, optimizer_kwargs

#: torch optimizers with a fused (multi-tensor, one kernel per step) implementation on CPU and CUDA. Unless the
#: config picks an implementation (`override_optimizer_config.fused` / `.foreach`), rlkit takes the fused one:
#: torch's own default on CPU is the per-parameter loop, ~2x slower for AdamW (measured on SmolLM2-135M, fp32
#: masters: 0.40 -> 0.19 s a step; docs/performance.md). The same update rule, rounded differently in the last bit.
FUSED_OPTIMIZERS: tuple[type, ...] = (torch.optim.AdamW, torch.optim.Adam)
FUSED_DEVICES = ("cpu", "cuda")


def build_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig,
                    prefix: str = "optim") -> torch.optim.Optimizer:
    """`optimizer_impl.optimizer(params, lr, weight_decay, [betas], **override_optimizer_config)`, as verl builds it
    (torch's Adam/AdamW fused where the config leaves the implementation open: FUSED_OPTIMIZERS)."""
    cls, kwargs, params = optimizer_class(optim, prefix), optimizer_kwargs(optim), list(params)
    if fusable(cls, kwargs, params):
        kwargs["fused"] = True
    return cls(params, **kwargs)


def fusable(cls: type, kwargs: dict, params: list[torch.nn.Parameter]) -> bool:
    """A torch optimizer with a fused kernel, no implementation chosen, every parameter a float on CPU or CUDA."""
    return (cls in FUSED_OPTIMIZERS and not {"fused", "foreach"} & set(kwargs) and bool(params)
            and all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params))
