"""`rlkit generate key=value ...`: verl's `python -m verl.trainer.main_generation` in one process."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlkit_cli.errors import friendly_errors


def generate_command(
    overrides: list[str] = typer.Argument(
        None, help="verl's generation keys: data.path, data.prompt_key (prompt), data.n_samples (5), "
        "data.output_path, data.batch_size (128), data.apply_chat_template_kwargs, model.path, and rollout.* "
        "(name, temperature 1.0, top_k 50, top_p 0.7, prompt_length 1536, response_length 512, do_sample, dtype, "
        "seed, engine_kwargs, ...); trainer.*, actor.*, ray_kwargs.* are accepted and have nothing to set."
    ),
    config: Path = typer.Option(None, "--config", "-c", help="YAML file in the same keys (overrides win)."),
) -> None:
    """Generate N responses per prompt of a parquet (or .jsonl/.json) into a parquet: the input rows plus a
    `responses` column holding a list of N strings per row, as verl's main_generation writes.

    verl's `python3 -m verl.trainer.main_generation ...` replaced by `rlkit generate ...` with the same keys; one
    process (no Ray), vLLM where installed (else hf, or rollout.name=hf). The model may be a folder, alias, hub id,
    a training checkpoint (global_step_N) or a PEFT adapter folder.

    Example:
      rlkit generate data.path=~/data/gsm8k/test.parquet data.n_samples=4 data.output_path=~/data/gen/test.parquet
      model.path=smollm2-135m-instruct rollout.temperature=0.8 rollout.response_length=256

    Exit status: 0 on success, 1 on bad input (an unknown key, a missing file or model).
    """
    from rlkit.utils.quiet import quiet_process

    quiet_process(bars=True)
    from rlkit.eval.generate import generate, load_job

    job = load_job(list(overrides or []), str(config) if config else None)
    console = Console()
    for line in job.notices:
        console.print(f"[yellow]note:[/yellow] {escape(line)}", soft_wrap=True)
    with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        task = bar.add_task("generate", total=None)
        out = generate(job, progress=lambda done, total: bar.update(task, completed=done, total=total),
                       notify=lambda msg: console.print(f"[yellow]note:[/yellow] {escape(msg)}", soft_wrap=True))
    console.print(f"{job.data['n_samples']} responses per prompt: {out}", soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    app.command("generate", context_settings={"allow_extra_args": False})(friendly_errors(generate_command))
