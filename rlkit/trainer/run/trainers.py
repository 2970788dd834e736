"""The trainer kinds, one row each (torchtune's recipe registry is the model): where a kind's config is loaded
and which module launches it. `rlkit train NAME` runs the row NAME; any other first word is an RL algorithm
preset (or an override), run by the `rl` row.

A kind's launcher module defines `plan(cfg) -> rich Table` (the resource plan of --dry-run and start-up),
`preflight(cfg, allow_download) -> notes` (UserError on a problem), `start(cfg, opts) -> trainer` (a
TrainerBase, workers built) and `describe(trainer, summary, cfg)` (its run-summary lines); the run around them is
every kind's (rlkit/trainer/run/launch.py `run_kind`). Paths are "module:function" strings imported when used, so
the CLI lists the names in its help without importing a trainer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rlkit.registry import Registry


@dataclass(frozen=True)
class TrainerEntry:
    """`loader`: "module:function" returning the kind's validated config (its schema and base YAML in
    rlkit/config/conf/) from (overrides, config_file, config_path, config_name, notices), after the algorithm
    preset when `presets`; `launcher`: the kind's launcher module; `debug`: whether `--debug` applies (worker
    phases to break at)."""

    loader: str
    launcher: str
    help: str
    presets: bool = False
    debug: bool = False

    def load(self, preset: str | None, overrides: list[str], config_file: str | None, config_path: str | None,
             config_name: str | None, notices: list[str]) -> Any:
        module, _, name = self.loader.partition(":")
        load = getattr(importlib.import_module(module), name)
        args = (overrides, config_file, config_path, config_name, notices)
        return load(preset, *args) if self.presets else load(*args)

    def module(self) -> ModuleType:
        return importlib.import_module(self.launcher)

    def plan(self, cfg: Any) -> Any:
        return self.module().plan(cfg)

    def check(self, cfg: Any, allow_download: bool = False) -> list[str]:
        return self.module().preflight(cfg, allow_download=allow_download)

    def run(self, cfg: Any, opts: Any, console: Any = None) -> Any:
        from rlkit.trainer.run.launch import run_kind

        return run_kind(self.module(), cfg, opts, console)


TRAINERS: Registry[TrainerEntry] = Registry("trainer")
TRAINERS.add("rl", TrainerEntry(
    "rlkit.trainer.run.run_config:load_config", "rlkit.trainer.kinds.rl_launch",
    "RL post-training, the algorithm from a preset or algorithm.* keys (verl's main_ppo keys; docs/verl.md)",
    presets=True, debug=True))
TRAINERS.add("sft", TrainerEntry(
    "rlkit.config.sft_load:load_sft_config", "rlkit.trainer.kinds.sft_launch",
    "supervised fine-tuning on conversations (verl's SFT keys; docs/sft.md)"))
TRAINERS.add("dpo", TrainerEntry(
    "rlkit.config.dpo_load:load_dpo_config", "rlkit.trainer.kinds.dpo_launch",
    "preference optimisation on prompt/chosen/rejected pairs (TRL's losses; docs/dpo.md)"))
