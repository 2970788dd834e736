"""`rlkit eval MODEL_OR_CHECKPOINT --data FILE [--n K --limit N]`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlkit.errors import UserError
from rlkit_cli.errors import friendly_errors


def eval_command(
    model: str = typer.Argument(..., help="HF folder, alias, hub id, a training checkpoint (global_step_N), or a "
                                "PEFT adapter folder (merged into the base its adapter_config.json names)."),
    data: Path = typer.Option(..., "--data", "-d", help="Parquet file in the RL schema (see `rlkit data`)."),
    n: int = typer.Option(1, "--n", "-k", help="Samples per prompt (K in mean@K / best@K / pass@K / maj@K)."),
    limit: int = typer.Option(None, "--limit", help="Evaluate only the first N prompts."),
    temperature: float = typer.Option(None, "--temperature", help="Default: 0 (greedy) for n=1, else 1.0."),
    max_response_length: int = typer.Option(512, "--max-response-length", help="Max new tokens."),
    max_prompt_length: int = typer.Option(512, "--max-prompt-length", help="Longer prompts are cut on the left."),
    backend: str = typer.Option(None, "--backend", help="vllm | hf (default: vllm when installed)."),
    out: Path = typer.Option(None, "--out", "-o", help="JSONL of generations with scores (default: next to data)."),
    tools: str = typer.Option(None, "--tools", help="Comma list of tools (calculator, python, notepad, ...): runs the "
                              "multi-turn agent loop, as training's actor_rollout_ref.rollout.multi_turn does."),
    max_turns: int = typer.Option(4, "--max-turns", help="With --tools: assistant turns per sample."),
    interaction: str = typer.Option(None, "--interaction", help="With --tools: a simulated user answering tool-free "
                                    "turns (fixed_reply, gsm8k_retry, ...)."),
) -> None:
    """Score a model or checkpoint on a dataset: mean@K, best@K, pass@K, maj@K per data_source.

    The numbers are defined as training's validation defines them (val/<data_source>/...): a sample is
    correct when the scorer's `acc` says so (else at a full score); responses with no extracted answer
    do not vote in maj@K.

    Example: rlkit eval smollm2-135m-instruct --data ~/data/gsm8k/test.parquet --n 4 --limit 50
    Multi-turn, with tools: rlkit eval ./ckpt/global_step_100 --data test.parquet --tools calculator --max-turns 3

    Exit status: 0 on success, 1 on bad input (missing model/data).
    """
    from rlkit.utils.quiet import quiet_process

    quiet_process(bars=True)  # our bar only: no engine/transformers loading bars (RLKIT_VERBOSE=1 shows them)
    from rlkit.eval.evaluator import evaluate, write_jsonl
    from rlkit.utils.fs_checks import ensure_writable_file

    if not data.exists():
        raise UserError(f"--data {data}: no such file; make one with `rlkit data NAME --out DIR`")
    out = ensure_writable_file(out or data.with_name(f"{data.stem}.eval.jsonl"), "--out")  # before the work
    multi_turn = agent_config(tools, max_turns, interaction)
    console = Console()
    with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        task = bar.add_task("eval", total=None)
        result = evaluate(
            model, str(data), n=n, limit=limit, backend=backend, temperature=temperature,
            max_prompt_length=max_prompt_length, max_response_length=max_response_length,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
            notify=lambda msg: console.print(f"[yellow]note:[/yellow] {escape(msg)}", soft_wrap=True),
            multi_turn=multi_turn,
        )
    table = Table(title=f"eval of {model} on {data.name} (K={n})")
    present = {k for m in result.metrics.values() for k in m}
    order = ["prompts", f"score/mean@{n}", f"score/best@{n}", f"acc/mean@{n}", f"acc/pass@{n}", f"acc/maj@{n}",
             "response_length/mean", "response_length/max", "num_turns/mean", "tool_calls/mean"]
    table.add_column("metric")  # the names validation logs under val/<data_source>/
    for ds in result.metrics:
        table.add_column(ds, justify="right")
    for k in (k for k in order if k in present):  # one row per metric: the sources fit side by side
        fmt = "{:.0f}" if k == "prompts" else "{:.3f}"
        table.add_row(k, *(fmt.format(m[k]) if k in m else "-" for m in result.metrics.values()))
    console.print(table)
    write_jsonl(result.rows, out)
    console.print(f"generations: {out}")


def agent_config(tools: str | None, max_turns: int, interaction: str | None):
    """The multi-turn config of --tools/--max-turns/--interaction (None without --tools), checked against the
    registries so a misspelt name fails before the model loads."""
    if not tools:
        if interaction:
            raise UserError("--interaction needs --tools (the agent loop); e.g. --tools calculator")
        return None
    from rlkit.config.agent import PREFIX, MultiTurnConfig
    from rlkit.rollout.agent.check import check_multi_turn

    names = [t.strip() for t in tools.split(",") if t.strip()]
    config = MultiTurnConfig(enable=True, tools=names, max_turns=max_turns, interaction=interaction or None)
    try:
        check_multi_turn(config)
    except UserError as exc:  # name the flag, not the training config key
        for key, flag in (("tools", "--tools"), ("interaction", "--interaction")):
            if str(exc).startswith(f"{PREFIX}{key}:"):
                raise UserError(flag + str(exc)[len(PREFIX + key):]) from None
        raise
    return config


def register(app: typer.Typer) -> None:
    app.command("eval")(friendly_errors(eval_command))
