"""`rlkit train ALGO [key=value ...]` and `rlkit export CKPT OUT`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from rlkit_cli.errors import UserError, friendly_errors

DEBUG_MODES = {"on": "on", "post-mortem": "post-mortem", "postmortem": "post-mortem"}


def train(
    algo: str = typer.Argument(..., help="Algorithm preset: grpo | ppo | rloo | reinforce_pp | dapo | gspo."),
    overrides: list[str] = typer.Argument(None, help="Config overrides key=value, e.g. actor_rollout_ref.rollout.n=8"),
    config: Path = typer.Option(None, "--config", "-c", help="YAML file merged over the preset."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and resource plan; run nothing."),
    address: str = typer.Option(None, "--address", help="Join a running Ray cluster (e.g. from `rlkit cluster up`)."),
    debug: bool = typer.Option(
        False, "--debug", help="Make every Ray worker debuggable (VS Code / `rlkit debug attach`). "
        "`--debug post-mortem` also pauses on uncaught exceptions."
    ),
    num_cpus: int = typer.Option(None, "--num-cpus", help="CPUs for a local Ray (default: all)."),
) -> None:
    """Train with an algorithm preset and any key=value overrides.

    Example:
      rlkit train grpo data.train_files=~/data/toy/train.parquet actor_rollout_ref.model.path=./tiny

    Exit status: 0 when training finished, 1 on a config/input error or a worker failure.
    """
    from rlkit.trainer.config import load_config, to_yaml
    from rlkit.trainer.launch import LaunchOptions, resource_plan, run_training

    overrides = list(overrides or [])
    mode = None
    if debug:
        mode = "on"
        for word in [o for o in overrides if o in DEBUG_MODES]:
            mode = DEBUG_MODES[word]
            overrides.remove(word)
    console = Console()
    cfg = load_config(algo, overrides, str(config) if config else None)
    if dry_run:
        console.print(to_yaml(cfg))
        console.print(resource_plan(cfg))
        return
    from rlkit.controller import WorkerError

    try:
        run_training(cfg, LaunchOptions(address=address, debug=mode, num_cpus=num_cpus), console)
    except WorkerError as exc:
        from rich.text import Text

        # The worker's traceback is plain text with ANSI colours: not rich markup ("x[role]" must survive), no wrapping.
        Console(stderr=True, soft_wrap=True).print("[bold red]worker failure:[/bold red]", Text.from_ansi(str(exc)))
        raise typer.Exit(1) from None


def export(
    checkpoint: Path = typer.Argument(..., help="A global_step_N folder (or a checkpoint root: its latest is used)."),
    out: Path = typer.Argument(..., help="Output folder for the plain HF model."),
) -> None:
    """Write the actor of a checkpoint as a plain Hugging Face folder (loadable with from_pretrained).

    Example: rlkit export checkpoints/rlkit/run/global_step_20 ./my-model

    Exit status: 0 on success, 1 if the checkpoint is missing or incomplete.
    """
    from rlkit.utils.checkpoint_io import resolve_resume
    from rlkit.workers.fsdp_model import export_hf

    path = resolve_resume(checkpoint.parent, str(checkpoint)) if checkpoint.exists() else None
    if path is None:
        raise UserError(f"no complete checkpoint at {checkpoint}")
    export_hf(path / "actor", out, tokenizer_dir=path / "actor" / "tokenizer")
    Console().print(f"exported {path} -> {out}")


def register(app: typer.Typer) -> None:
    app.command("train", context_settings={"allow_extra_args": False})(friendly_errors(train))
    app.command("export")(friendly_errors(export))
