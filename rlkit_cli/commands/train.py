"""`rlkit train ALGO [key=value ...]` and `rlkit export CKPT OUT`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from rlkit.config.load import preset_names
from rlkit.errors import UserError
from rlkit_cli.errors import friendly_errors

DEBUG_MODES = {"on": "on", "post-mortem": "post-mortem", "postmortem": "post-mortem", "nan": "nan"}


def trainer_names() -> str:
    """The trainer kinds with their one-line help, read from the registry (rlkit.trainer.run.trainers is light)."""
    from rlkit.trainer.run.trainers import TRAINERS

    return "; ".join(f"{name}, {TRAINERS.get(name).help}" for name in TRAINERS.names())


def train(
    algo: str = typer.Argument(
        None, help=f"Algorithm preset: {' | '.join(preset_names())}, or a trainer kind: {trainer_names()}. "
        "Optional: without it the run starts from verl's main_ppo defaults and "
        "algorithm.adv_estimator (default gae) picks the algorithm.", show_default=False,
    ),
    overrides: list[str] = typer.Argument(
        None, help="Config overrides in Hydra's grammar: key=v, +key=v (add), ++key=v (add or set), ~key (back to "
        "the default), lists \\[a,b], ${interpolation}; e.g. actor_rollout_ref.rollout.n=8"
    ),
    config: Path = typer.Option(None, "--config", "-c", help="YAML file merged over the preset."),
    config_path: Path = typer.Option(
        None, "--config-path", help="Folder of a YAML config tree (as verl's main_ppo); with --config-name."
    ),
    config_name: str = typer.Option(
        None, "--config-name", help="Primary YAML of --config-path (it may use its own groups there; `rlkit` in "
        "its defaults list is rlkit's base)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and resource plan; run nothing."),
    address: str = typer.Option(None, "--address", help="Join a running Ray cluster (e.g. from `rlkit cluster up`)."),
    debug: bool = typer.Option(
        False, "--debug", help="Make every Ray worker debuggable (VS Code / `rlkit debug attach`). "
        "`--debug post-mortem` also pauses on uncaught exceptions; `--debug nan` at the first NaN/Inf (a loss, "
        "gradient, log-prob, advantage or reward; in a log file it saves the micro-batch and stops with one line)."
    ),
    num_cpus: int = typer.Option(None, "--num-cpus", help="CPUs for a local Ray (default: all)."),
) -> None:
    """Train with an algorithm preset (or none, as verl's main_ppo) and any key=value overrides.

    Example:
      rlkit train grpo data.train_files=~/data/toy/train.parquet actor_rollout_ref.model.path=./tiny
      rlkit train ppo --config-path ./conf --config-name my_run +reward_model.scorer_kwargs.gsm8k.method=flexible
      rlkit train algorithm.adv_estimator=grpo data.train_files=... (a verl script: `python3 -m
      verl.trainer.main_ppo` replaced by `rlkit train`; docs/verl.md)
      rlkit train sft data.train_files=~/data/gsm8k_sft/train.parquet model.path=./tiny (verl's `torchrun ... -m
      verl.trainer.fsdp_sft_trainer` / `verl.trainer.sft_trainer` replaced by `rlkit train sft`; docs/sft.md)
      rlkit train dpo data.train_files=~/data/pairs/train.parquet model.path=./sft_model dpo.beta=0.1 (docs/dpo.md)

    verl's config keys are accepted: each is implemented, mapped to rlkit's equivalent (one line at start-up
    says what to what), or refused with one line saying why and what to use instead (docs/verl.md).

    The preset is the Hydra config group `algorithm` (rlkit/config/conf/algorithm/<ALGO>.yaml); the
    config is composed with Hydra's compose API (no output folder, no working-directory change).

    Before Ray starts, a pre-flight check (also run by --dry-run) verifies the data files (format, columns, rows
    against the batch), the model (its positions against prompt + response, its architecture against the engine),
    rollout.engine_kwargs.vllm against the installed vLLM, that the checkpoint and log folders are writable and that
    the disk can hold a checkpoint.

    Exit status: 0 when training finished, 1 on a config/input error or a worker failure,
    130 when stopped with Ctrl-C, 143 with SIGTERM (kill, Slurm, Kubernetes); the last line then says
    how to resume.
    """
    from rlkit.trainer.run.interrupt import InterruptWatch, TrainingInterrupted

    with InterruptWatch() as watch:  # Ctrl-C while the config loads and the pre-flight runs: the same one line
        try:
            _train(algo, overrides, config, config_path, config_name, dry_run, address, debug, num_cpus)
        except (TrainingInterrupted, KeyboardInterrupt) as exc:
            interrupted(watch, exc if isinstance(exc, TrainingInterrupted) else
                        TrainingInterrupted(None, None, None, watch.signum))
        except Exception:  # our interrupt, wrapped by the library it hit (OmegaConf while the config loads)
            if not watch.hit:
                raise
            interrupted(watch, TrainingInterrupted(None, None, None, watch.signum))


def interrupted(watch: Any, stop: Any) -> None:
    """The one line of a run stopped by Ctrl-C / SIGTERM (how to resume), then its exit status (130 / 143)."""
    watch.stopping()
    Console(stderr=True, soft_wrap=True).print(stop.line(sys.argv), markup=False, highlight=False)
    leave_now(stop.exit_code)
    raise typer.Exit(stop.exit_code) from None


def leave_now(code: int) -> None:
    """The `rlkit` program after an interrupted run, everything stopped and saved: exit without the interpreter's
    teardown, where Ray's core worker, torn down mid-start, has crashed (SIGSEGV) after the line was printed."""
    import os

    from rlkit_cli import running_as_program

    if running_as_program():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _train(algo: str | None, overrides: list[str], config: Path | None, config_path: Path | None,
           config_name: str | None, dry_run: bool, address: str | None, debug: bool, num_cpus: int | None) -> None:
    """Any trainer kind's config, notices, dry run and run (rlkit/trainer/run/trainers.py): `algo` names a kind
    (`sft`, `dpo`, `rl`) or an RL preset; without one, or when it is an override, the RL kind without a preset."""
    from rlkit.config.load import to_yaml
    from rlkit.trainer.run.launch import LaunchOptions
    from rlkit.trainer.run.run_summary import print_table
    from rlkit.trainer.run.trainers import TRAINERS

    overrides = list(overrides or [])
    if algo in TRAINERS:
        name, algo = algo, None  # a kind of its own (`rl`: verl's main_ppo, no preset)
    else:
        name = "rl"
        if algo is not None and ("=" in algo or algo.startswith(("+", "~")) or (debug and algo in DEBUG_MODES)):
            overrides, algo = [algo, *overrides], None  # no preset: the first word is an override (verl's main_ppo)
    entry = TRAINERS.get(name)
    mode = None
    if debug:
        if not entry.debug:
            raise UserError(f"--debug is for the RL trainer's worker phases; run `rlkit train {name}` without it")
        mode = "on"
        for word in [o for o in overrides if o in DEBUG_MODES]:
            mode = DEBUG_MODES[word]
            overrides.remove(word)
    notices: list[str] = []
    cfg = entry.load(algo, overrides, str(config) if config else None, str(config_path) if config_path else None,
                     config_name, notices)
    err = Console(stderr=True, soft_wrap=True)
    for line in notices:
        err.print(line, markup=False, highlight=False, style="yellow")
    console = Console()
    if dry_run:
        console.print(to_yaml(cfg))
        print_table(console, entry.plan(cfg))
        notes = entry.check(cfg, allow_download=False)  # a problem exits 1, as the real run would
        console.print("pre-flight ok: " + "; ".join(notes), soft_wrap=True, markup=False)
        return
    _run_reporting(lambda: entry.run(cfg, LaunchOptions(address=address, debug=mode, num_cpus=num_cpus), console),
                   cfg.trainer.default_local_dir)


def _run_reporting(run, checkpoints: str) -> None:
    """Run; a worker failure -> its traceback, the last checkpoint in `checkpoints` and the resume command, exit 1;
    `--debug nan`'s stop -> its one line, exit 1 (Ctrl-C and SIGTERM are `train`'s)."""
    from ray.exceptions import RayActorError

    from rlkit.controller import WorkerError
    from rlkit.debug.anomaly import NonFiniteValue, line_in

    try:
        run()
    except NonFiniteValue as exc:  # --debug nan, in the driver (a reward or an advantage)
        Console(stderr=True, soft_wrap=True).print(str(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None
    except (WorkerError, RayActorError) as exc:
        from rich.text import Text

        from rlkit.trainer.run.interrupt import rerun_command
        from rlkit.utils.checkpoint_io import find_latest_checkpoint

        if isinstance(exc, WorkerError) and (line := line_in(exc.detail)) is not None:
            Console(stderr=True, soft_wrap=True).print(line, markup=False, highlight=False)  # --debug nan: one line
            raise typer.Exit(1) from None
        # The worker's traceback is plain text with ANSI colours: not rich markup ("x[role]" must survive), no wrapping.
        err = Console(stderr=True, soft_wrap=True)
        err.print("[bold red]worker failure:[/bold red]", Text.from_ansi(str(exc)))
        checkpoint = find_latest_checkpoint(checkpoints)
        how = (f"no checkpoint saved yet; start again with: {rerun_command(sys.argv, resume=False)}"
               if checkpoint is None else
               f"last complete checkpoint: {checkpoint}; resume with: {rerun_command(sys.argv, resume=True)}")
        err.print(how, markup=False, highlight=False)
        raise typer.Exit(1) from None


def export(
    checkpoint: Path = typer.Argument(..., help="A global_step_N folder (or a checkpoint root: its latest is used)."),
    out: Path = typer.Argument(..., help="Output folder for the plain HF model."),
    force: bool = typer.Option(False, "--force", "-f", help="Write into OUT even if it already holds files."),
    adapter_only: bool = typer.Option(
        False, "--adapter-only", help="LoRA runs: write the PEFT adapter folder (adapter_config.json + "
        "adapter_model.safetensors) instead of the merged model; peft.PeftModel.from_pretrained(base, OUT) loads it."
    ),
) -> None:
    """Write the actor of a checkpoint as a plain Hugging Face folder (loadable with from_pretrained).

    A LoRA checkpoint holds the adapter only: by default it is merged into its base model (the folder the
    run trained on); --adapter-only writes the adapter alone.

    Example: rlkit export checkpoints/rlkit/run/global_step_20 ./my-model
             rlkit export checkpoints/rlkit/run/global_step_20 ./my-adapter --adapter-only

    Exit status: 0 on success, 1 if the checkpoint is missing or incomplete, or OUT holds files (see --force).
    """
    from rlkit.models.lora import read_lora_info
    from rlkit.utils.checkpoint_io import CheckpointError, open_checkpoint
    from rlkit.utils.checkpoint_verify import short_reason
    from rlkit.utils.fs_checks import ensure_writable_dir
    from rlkit.workers.fsdp_model import export_hf

    path = open_checkpoint(checkpoint, "rlkit export")
    if adapter_only and read_lora_info(path / "actor") is None:
        raise UserError(f"{path} is a full fine-tuning checkpoint (no LoRA adapter); drop --adapter-only")
    out = out.expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file; pass a folder for the exported model")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"{out} already holds files; pass --force to write into it or choose another folder")
    ensure_writable_dir(out, "rlkit export")
    try:
        export_hf(path / "actor", out, tokenizer_dir=path / "actor" / "tokenizer", adapter_only=adapter_only)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP/transformers errors on a damaged checkpoint (CheckpointException is one)
        if isinstance(exc, OSError) and str(exc.filename or "").startswith(str(out)):
            raise UserError(f"rlkit export: cannot write {exc.filename} ({exc.strerror})") from None
        raise CheckpointError(f"rlkit export: cannot load {path / 'actor'} ({short_reason(exc)}); "
                              "export another checkpoint") from None
    Console().print(f"exported {path} -> {out}{' (LoRA adapter)' if adapter_only else ''}")


def register(app: typer.Typer) -> None:
    app.command("train", context_settings={"allow_extra_args": False})(friendly_errors(train))
    app.command("export")(friendly_errors(export))
