"""The trainers that are not RL presets (`rlkit train sft`, `rlkit train dpo`): name -> how to load its config, what
its dry run prints, how it runs. `rlkit train NAME` looks here before the algorithm presets.

An entry is light (its modules are imported when it is used), so the CLI can list the names in its help.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlkit.registry import Registry


@dataclass(frozen=True)
class TrainerEntry:
    """`load(overrides, config_file, config_path, config_name, notices) -> cfg`; `plan(cfg) -> rich Table` (the
    dry run's resource plan); `run(cfg, LaunchOptions, Console) -> FitSummary`; `check(cfg) -> notes` (pre-flight)."""

    load: Callable[..., Any]
    plan: Callable[[Any], Any]
    run: Callable[..., Any]
    check: Callable[[Any], list[str]]
    help: str


TRAINERS: Registry[TrainerEntry] = Registry("trainer")


def _sft_load(*args: Any, **kwargs: Any) -> Any:
    from rlkit.config.sft_load import load_sft_config

    return load_sft_config(*args, **kwargs)


def _sft_plan(cfg: Any) -> Any:
    from rlkit.trainer.kinds.sft_launch import sft_plan

    return sft_plan(cfg)


def _sft_run(cfg: Any, opts: Any, console: Any) -> Any:
    from rlkit.trainer.kinds.sft_launch import run_sft

    return run_sft(cfg, opts, console)


def _sft_check(cfg: Any) -> list[str]:
    from rlkit.trainer.kinds.sft_launch import sft_preflight

    return sft_preflight(cfg)


TRAINERS.add("sft", TrainerEntry(_sft_load, _sft_plan, _sft_run, _sft_check,
                                 "supervised fine-tuning on conversations (verl's SFT keys; docs/sft.md)"))


def _dpo_load(*args: Any, **kwargs: Any) -> Any:
    from rlkit.config.dpo_load import load_dpo_config

    return load_dpo_config(*args, **kwargs)


def _dpo_plan(cfg: Any) -> Any:
    from rlkit.trainer.kinds.dpo_launch import dpo_plan

    return dpo_plan(cfg)


def _dpo_run(cfg: Any, opts: Any, console: Any) -> Any:
    from rlkit.trainer.kinds.dpo_launch import run_dpo

    return run_dpo(cfg, opts, console)


def _dpo_check(cfg: Any) -> list[str]:
    from rlkit.trainer.kinds.dpo_launch import dpo_preflight

    return dpo_preflight(cfg)


TRAINERS.add("dpo", TrainerEntry(_dpo_load, _dpo_plan, _dpo_run, _dpo_check,
                                 "preference optimisation on prompt/chosen/rejected pairs (TRL's losses; docs/dpo.md)"))
