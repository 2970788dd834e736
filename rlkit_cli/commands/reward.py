"""`rlkit reward score`: score a JSONL file of responses with the training reward path."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from rlkit.errors import UserError
from rlkit.utils.fs_checks import ensure_writable_file
from rlkit_cli.errors import friendly_errors

reward_app = typer.Typer(
    help="Rewards: score responses offline with the same scorers as training. "
    "Example: [bold]rlkit reward score responses.jsonl[/bold]",
    rich_markup_mode="rich",
    no_args_is_help=True,
)
console = Console()


def register(app: typer.Typer) -> None:
    app.add_typer(reward_app, name="reward")


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """Parse and check every line first, so a bad line fails before any scoring work."""
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{path} line {lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path} line {lineno}: expected a JSON object, got {type(row).__name__}")
            for key in ("data_source", "response", "ground_truth"):
                if key not in row:
                    raise UserError(
                        f"{path} line {lineno}: missing key '{key}' (needs data_source, response, ground_truth)"
                    )
            if not isinstance(row["response"], str):
                raise UserError(f"{path} line {lineno}: 'response' must be a string")
            if row.get("extra_info") is not None and not isinstance(row["extra_info"], dict):
                raise UserError(f"{path} line {lineno}: 'extra_info' must be an object")
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no rows to score (empty file)")
    return rows


def _summary(rows: list[dict[str, Any]], results: list) -> Table:
    groups: dict[str, list] = defaultdict(list)
    for i, (row, res) in enumerate(zip(rows, results)):
        groups[str(row["data_source"])].append((i, res))
    rm = "rm_score" in rows[0]
    judge = "judge_score" in rows[0]
    cols = ["data_source", "scorer", "count", "mean score", "errors"]
    cols += ["mean rm score"] if rm else []
    cols += ["mean judge score", "judge errors"] if judge else []
    table = Table(title="reward score")
    for col in cols:
        table.add_column(col, justify="left" if col in ("data_source", "scorer") else "right")
    for ds, members in sorted(groups.items()):
        res = [r for _, r in members]
        scorers = ",".join(sorted({r.scorer for r in res}))
        errors = sum(r.error is not None for r in res)
        mean = sum(r.score for r in res) / len(res)
        cells = [ds, scorers, str(len(res)), f"{mean:.4f}", f"[red]{errors}[/red]" if errors else "0"]
        if rm:
            cells.append(f"{sum(rows[i]['rm_score'] for i, _ in members) / len(members):.4f}")
        if judge:
            judge_errors = sum("judge_error" in rows[i] for i, _ in members)
            cells += [f"{sum(rows[i]['judge_score'] for i, _ in members) / len(members):.4f}",
                      f"[red]{judge_errors}[/red]" if judge_errors else "0"]
        table.add_row(*cells)
    return table


def _prompts(rows: list[dict[str, Any]], path: Path, option: str, required: bool) -> list[Any]:
    """Each row's `prompt` (a string or chat messages); a model reward reads it with the response."""
    prompts = []
    for i, row in enumerate(rows, start=1):
        prompt = row.get("prompt")
        if prompt is None and required:
            raise UserError(f"{path} row {i}: {option} needs a 'prompt' (a string or a list of {{role, content}} "
                            "messages) next to the response")
        if prompt is not None and not isinstance(prompt, (str, list)):
            raise UserError(f"{path} row {i}: 'prompt' must be a string or a list of {{role, content}} messages")
        prompts.append(prompt if prompt is not None else "")
    return prompts


def _rm_scores(reward_model: str, prompts: list[Any], responses: list[str], max_length: int | None,
               batch_size: int) -> list[float]:
    """The classifier RM of training (rlkit.workers.reward_model), in this process: prompt + response rendered
    with the RM's chat template, the score at the last token."""
    import torch

    from rlkit.config.fsdp import FSDPConfig
    from rlkit.config.reward_model import RewardModelConfig, RewardModelModelConfig
    from rlkit.models.resolve import resolve_model_path
    from rlkit.workers.reward_model import RewardModelScorer

    model = RewardModelModelConfig(path=str(resolve_model_path(reward_model)),
                                   fsdp_config=FSDPConfig(param_dtype="float32"))  # one process: no sharding
    cfg = RewardModelConfig(enable=True, model=model, max_length=max_length, micro_batch_size_per_gpu=batch_size)
    scorer = RewardModelScorer(cfg, torch.device("cpu"))
    return scorer.score_rows(scorer.text_rows(prompts, responses)).tolist()


@reward_app.command("score")
@friendly_errors
def score(
    input_path: Path = typer.Argument(
        ..., metavar="IN.jsonl", help="Lines of {data_source, response, ground_truth, extra_info?}."
    ),
    out: Path = typer.Option(
        None, "--out", "-o", help="Where to write the scored lines (default: IN.scored.jsonl next to IN)."
    ),
    method: str = typer.Option(
        None, "--method", help="gsm8k extraction: strict (last '#### N') or flexible (last number)."
    ),
    custom_path: Path = typer.Option(None, "--custom-path", help="A .py file with your reward function."),
    custom_name: str = typer.Option("compute_score", "--custom-name", help="The function's name in --custom-path."),
    workers: int = typer.Option(4, "--workers", help="Scorer threads."),
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds per sample before it scores 0."),
    reward_model: str = typer.Option(
        None, "--reward-model", help="Also score with this classifier RM (folder, hub id or alias of an "
        "AutoModelForSequenceClassification, one label); rows need a 'prompt'. Writes rm_score."),
    rm_max_length: int = typer.Option(None, "--rm-max-length", help="Longest RM input; longer ones keep their "
                                      "last tokens (as reward_model.max_length)."),
    rm_batch_size: int = typer.Option(8, "--rm-batch-size", help="Rows per RM forward."),
    judge_url: str = typer.Option(None, "--judge-url", help="Also score with an LLM judge at this OpenAI-"
                                  "compatible endpoint, e.g. http://127.0.0.1:8000/v1. Writes judge_score."),
    judge_model: str = typer.Option(None, "--judge-model", help="The judge's model name (http) or local "
                                    "folder (with --judge-backend vllm)."),
    judge_backend: str = typer.Option("http", "--judge-backend", help="http | vllm (an in-process engine)."),
    judge_template: Path = typer.Option(None, "--judge-template", help="A file with the judge prompt template "
                                        "({prompt}, {response}, {ground_truth}); default: a 0-10 grading prompt."),
    judge_parser: str = typer.Option("last_number_0_10", "--judge-parser", help="How a verdict becomes a score "
                                     "(a registered parser or path/to/file.py:function)."),
    judge_concurrency: int = typer.Option(8, "--judge-concurrency", help="Judge requests in flight."),
    judge_timeout: float = typer.Option(30.0, "--judge-timeout", help="Seconds per judge request."),
) -> None:
    """Score each line and write it back with `score` (and `reward_extra`, `reward_error`); with
    --reward-model also `rm_score`, with --judge-url/--judge-model also `judge_score` (and `judge_error`).

    Prints a table per data_source: count, mean score, errors (and the mean RM / judge scores beside the rule
    scores). Exit 0, or 1 on bad input.

    Example: [bold]rlkit reward score responses.jsonl --out scored.jsonl --method flexible[/bold]

    Example: [bold]rlkit reward score chats.jsonl --reward-model ./my-rm --judge-url http://127.0.0.1:8000/v1
    --judge-model Qwen/Qwen2.5-7B-Instruct[/bold]
    """
    from rlkit.reward.manager import RewardManager

    if method is not None and method not in ("strict", "flexible"):
        raise UserError(f"--method must be 'strict' or 'flexible', got '{method}'")
    rows = _read_rows(input_path)
    judge_cfg = None
    if judge_url or judge_model:
        from rlkit.config.judge import JudgeConfig
        from rlkit.reward.llm_judge import check_judge_config

        judge_cfg = JudgeConfig(backend=judge_backend, base_url=judge_url or "", model=judge_model or "",
                                template_path=str(judge_template) if judge_template else None, parser=judge_parser,
                                concurrency=judge_concurrency, timeout_s=judge_timeout)
        check_judge_config(judge_cfg)  # a bad option fails before any scoring
    prompts = _prompts(rows, input_path, "--reward-model", required=reward_model is not None)
    out = ensure_writable_file(
        out or input_path.with_name(input_path.name.removesuffix(".jsonl") + ".scored.jsonl"), "--out"
    )  # checked before scoring, which can take long (code sandboxes, custom functions)
    custom = {"path": str(custom_path), "name": custom_name} if custom_path else None
    kwargs = {"gsm8k": {"method": method}} if method else None
    manager = RewardManager(None, custom_fn=custom, num_workers=workers, timeout_s=timeout, scorer_kwargs=kwargs)
    results = manager.score_texts(
        [r["response"] for r in rows],
        [r["ground_truth"] for r in rows],
        [str(r["data_source"]) for r in rows],
        [r.get("extra_info") for r in rows],
    )
    responses = [r["response"] for r in rows]
    if reward_model is not None:
        for row, value in zip(rows, _rm_scores(reward_model, prompts, responses, rm_max_length, rm_batch_size)):
            row["rm_score"] = value
    if judge_cfg is not None:
        from rlkit.reward.judge_text import prompt_text
        from rlkit.reward.llm_judge import judge_texts

        truths = [None if r["ground_truth"] is None else str(r["ground_truth"]) for r in rows]
        verdicts, _ = judge_texts(judge_cfg, [prompt_text(p) for p in prompts], responses, truths)
        for row, verdict in zip(rows, verdicts):
            row["judge_score"] = verdict.score
            if verdict.error is not None:
                row["judge_error"] = verdict.error
    with out.open("w", encoding="utf-8") as fh:
        for row, res in zip(rows, results):
            row = {**row, "score": res.score}
            if res.extras:
                row["reward_extra"] = res.extras
            if res.error:
                row["reward_error"] = res.error
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    console.print(_summary(rows, results))
    console.print(f"wrote {len(rows)} rows to {out}")
