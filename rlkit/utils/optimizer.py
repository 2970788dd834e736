"""The optimizer a trained role steps, built as its config's `optim` section names it (rlkit.config.optim)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlkit.config.optim import OptimConfig, optimizer_class, optimizer_kwargs


def build_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig,
                    prefix: str = "optim") -> torch.optim.Optimizer:
    """`optimizer_impl.optimizer(params, lr, weight_decay, [betas], **override_optimizer_config)`, as verl builds it."""
    return optimizer_class(optim, prefix)(params, **optimizer_kwargs(optim))
