"""The optimizer section of a trained role (actor, critic, SFT): which torch optimizer, its arguments, the LR schedule.

verl builds the optimizer as `getattr(import_module(optimizer_impl), optimizer)(params, lr=, weight_decay=,
betas= (Adam-like classes only), **override_optimizer_config)`; rlkit does the same (rlkit.utils.optimizer).
verl's Megatron optimizer has an absolute floor `min_lr`, its FSDP one the fraction `min_lr_ratio`: both are read
here and must agree when both are set (`settle_optim`).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any

from rlkit.errors import UserError

#: the optimizer rlkit has always built; checking it needs no import
DEFAULT_OPTIMIZER = ("torch.optim", "AdamW")


def _f(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002 - as schema.f
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "peak learning rate")
    weight_decay: float = _f(0.01, "weight decay (decoupled for AdamW)")
    betas: list = _f(factory=lambda: [0.9, 0.999], help="betas, passed to Adam-like optimizers (a class whose name "
                     "contains 'adam' or 'ademamix', as verl)")
    lr_warmup_steps: int = _f(-1, "warmup steps; -1 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = _f(0.0, "warmup as a fraction of total steps")
    lr_scheduler_type: str = _f("constant", "schedule after warmup (rlkit.utils.lr_schedule.LR_SCHEDULES)")
    min_lr_ratio: float = _f(0.0, "cosine floor as a fraction of lr")
    min_lr: float | None = _f(None, "cosine floor as an absolute learning rate (verl's Megatron optim.min_lr); sets "
                              "min_lr_ratio = min_lr / lr (both set: they must agree); null = min_lr_ratio")
    optimizer: str = _f("AdamW", "optimizer class name, looked up in optimizer_impl (e.g. SGD, Adam, AdamW)")
    optimizer_impl: str = _f("torch.optim", "module holding the optimizer class (an installed package)")
    override_optimizer_config: dict = _f(factory=dict, help="extra keyword arguments of the optimizer class, over "
                                         "lr/weight_decay/betas (e.g. {eps: 1e-6, amsgrad: true}); torch's Adam/AdamW "
                                         "run fused unless this sets fused or foreach; verl's Megatron CPU-offload "
                                         "options here are mapped with a line")

    def __post_init__(self) -> None:
        if self.override_optimizer_config is None:  # verl's default spelling of "no overrides"
            self.override_optimizer_config = {}


def settle_optim(optim: OptimConfig, prefix: str) -> None:
    """`min_lr` into `min_lr_ratio` (one floor), and the optimizer class checked importable with its arguments."""
    if optim.min_lr is not None:
        if optim.lr <= 0:
            raise UserError(f"{prefix}.min_lr={optim.min_lr} needs {prefix}.lr > 0 (the floor is min_lr / lr)")
        ratio = optim.min_lr / optim.lr
        if optim.min_lr_ratio and not math.isclose(optim.min_lr_ratio, ratio, rel_tol=1e-6):
            raise UserError(f"{prefix}.min_lr={optim.min_lr} and {prefix}.min_lr_ratio={optim.min_lr_ratio} set two "
                            f"different floors (min_lr / lr = {ratio:g}); set one of them")
        if not 0.0 <= ratio <= 1.0:
            raise UserError(f"{prefix}.min_lr={optim.min_lr} must be between 0 and {prefix}.lr={optim.lr}")
        optim.min_lr_ratio = ratio
    if (optim.optimizer_impl, optim.optimizer) != DEFAULT_OPTIMIZER or optim.override_optimizer_config:
        check_optimizer_args(optimizer_class(optim, prefix), optim, prefix)


def optimizer_class(optim: OptimConfig, prefix: str) -> type:
    """`optimizer_impl.optimizer` imported, or one line naming the key."""
    try:
        module = importlib.import_module(optim.optimizer_impl)
    except ImportError as exc:
        raise UserError(f"{prefix}.optimizer_impl={optim.optimizer_impl}: cannot import it ({exc}); install the "
                        "package or use torch.optim") from None
    cls = getattr(module, optim.optimizer, None)
    if not isinstance(cls, type):
        raise UserError(f"{prefix}.optimizer={optim.optimizer}: no such class in {optim.optimizer_impl}; e.g. "
                        f"{prefix}.optimizer=AdamW")
    return cls


def optimizer_kwargs(optim: OptimConfig) -> dict[str, Any]:
    """What the class is built with, as verl passes it: lr, weight_decay, betas for Adam-like names, the overrides."""
    kwargs: dict[str, Any] = {"lr": optim.lr, "weight_decay": optim.weight_decay}
    name = optim.optimizer.lower()
    if "adam" in name or "ademamix" in name:
        kwargs["betas"] = tuple(optim.betas)
    kwargs.update(optim.override_optimizer_config)
    if isinstance(kwargs.get("betas"), list):
        kwargs["betas"] = tuple(kwargs["betas"])
    return kwargs


def check_optimizer_args(cls: type, optim: OptimConfig, prefix: str) -> None:
    """Every argument is one the class takes (a typo fails at start-up, not in the first update)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(optimizer_kwargs(optim)) - set(params))
    if unknown:
        takes = ", ".join(p for p in params if p not in ("self", "params"))
        raise UserError(f"{prefix}.override_optimizer_config: {optim.optimizer_impl}.{optim.optimizer} takes no "
                        f"argument {', '.join(unknown)} (it takes {takes})")
