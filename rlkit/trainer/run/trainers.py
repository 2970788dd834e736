"""The trainers that are not RL presets (`rlkit train sft`, `rlkit train dpo`), one row each: where its config is
loaded, what its dry run prints, its pre-flight and its run. `rlkit train NAME` looks here
before the algorithm presets. (torchtune's recipe registry is the model: a kind is a row, not a chain of launchers.)

The functions are "module:function" paths imported when used, so the CLI can list the names in its help without
importing a trainer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rlkit.registry import Registry


def _function(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class TrainerEntry:
    """`load(overrides, config_file, config_path, config_name, notices) -> cfg`; `plan(cfg) -> rich Table` (the
    dry run's resource plan); `check(cfg) -> notes` (pre-flight); `run(cfg, LaunchOptions, Console) -> FitSummary`.
    The loader's module declares the kind's config space (schema and base YAML in rlkit/config/conf/)."""

    loader: str
    launcher: str  # the module holding `plan`, `check` and `run` under the names below
    help: str
    plan_fn: str = "plan"
    check_fn: str = "preflight"
    run_fn: str = "run"

    def load(self, *args: Any, **kwargs: Any) -> Any:
        return _function(self.loader)(*args, **kwargs)

    def plan(self, cfg: Any) -> Any:
        return _function(f"{self.launcher}:{self.plan_fn}")(cfg)

    def check(self, cfg: Any) -> list[str]:
        return _function(f"{self.launcher}:{self.check_fn}")(cfg)

    def run(self, cfg: Any, opts: Any, console: Any) -> Any:
        return _function(f"{self.launcher}:{self.run_fn}")(cfg, opts, console)


TRAINERS: Registry[TrainerEntry] = Registry("trainer")
TRAINERS.add("sft", TrainerEntry(
    "rlkit.config.sft_load:load_sft_config", "rlkit.trainer.kinds.sft_launch",
    "supervised fine-tuning on conversations (verl's SFT keys; docs/sft.md)",
    plan_fn="sft_plan", check_fn="sft_preflight", run_fn="run_sft"))
TRAINERS.add("dpo", TrainerEntry(
    "rlkit.config.dpo_load:load_dpo_config", "rlkit.trainer.kinds.dpo_launch",
    "preference optimisation on prompt/chosen/rejected pairs (TRL's losses; docs/dpo.md)",
    plan_fn="dpo_plan", check_fn="dpo_preflight", run_fn="run_dpo"))
