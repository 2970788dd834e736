"""Time one GRPO step, phase by phase, on a fixed workload; print a table and write JSON.

    .venv/bin/python bench/grpo_step.py                       # tiny random model, toy prompts
    .venv/bin/python bench/grpo_step.py --model ~/.cache/rlkit/models/smollm2-135m-instruct-*/ \\
        --prompts 4 --n 4 --response-length 128 --steps 4      # a real model (any HF folder or alias)
    .venv/bin/python bench/grpo_step.py --rollout vllm --set trainer.n_gpus_per_node=2

The workload: `--prompts` toy-copy prompts per step ("copy the digits : 3 1 4 ...", written to a
temp parquet by `rlkit data toy`, or `--data FILE` for your own) x `--n` samples, up to
`--response-length` new tokens, GRPO with a KL loss against the reference model (so the `ref`
phase runs; `--no-kl` drops it) and recomputed old log-probs (`--no-recompute` lets the update
reuse its first forward instead, as a one-pass GRPO run does). Everything else is the `grpo`
preset; `--set key=value` overrides any config key.

It runs `RLTrainer.train_step` `--steps` times (no validation, no checkpoints) and reports the
median of steps 2..N (step 1 warms up) for each phase, as the trainer's `timing_s/*` metrics
measure them on the driver:

  gen             rollout (the engine call: wake, generate, sleep), excluding reward
  reward          scoring on the driver
  old_log_prob    the actor's forward over the batch (when recomputed)
  ref             the reference model's forward (when a KL is used)
  adv             advantages on the driver
  update_actor    PPO mini-batch updates (forward + backward + optimizer)
  update_weights  actor -> rollout engine weight sync
  step            the whole step; "other" = step minus the phases above

Tokens/s: `perf/throughput` (prompt + response tokens of the batch / step time) and generated
response tokens / gen time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

KEEP_PER_STEP = ("step", "timing_s/", "perf/", "response_length/mean", "critic/score/mean")
PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF folder / alias / .gguf; default: a tiny random model")
    p.add_argument("--rollout", default="hf", help="rollout backend (a name in ROLLOUT_BACKENDS)")
    p.add_argument("--data", default=None, help="a parquet in the RL schema; default: toy copy prompts")
    p.add_argument("--digits", type=int, default=8, help="digits per toy prompt")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (rollout.n)")
    p.add_argument("--prompt-length", type=int, default=64, help="data.max_prompt_length (left-padded)")
    p.add_argument("--response-length", type=int, default=128, help="max new tokens")
    p.add_argument("--steps", type=int, default=5, help="steps to run; the table is the median of 2..N")
    p.add_argument("--workers", type=int, default=1, help="worker processes (trainer.n_gpus_per_node)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPU cores per worker (torch threads)")
    p.add_argument("--micro-batch", type=int, default=16, help="ppo_micro_batch_size_per_gpu (and ref's)")
    p.add_argument("--no-kl", action="store_true", help="no KL loss: the reference model is not loaded")
    p.add_argument("--no-recompute", action="store_true", help="do not recompute old log-probs (one-pass GRPO)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides")
    p.add_argument("--out", default="bench/results/grpo_step.json", help="JSON output path")
    return p.parse_args(argv)


def toy_parquet(out: Path, digits: int) -> Path:
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    res = CliRunner().invoke(app, ["data", "toy", "--out", str(out), "--length", str(digits), "--train-size", "512",
                                   "--test-size", "8"])
    if res.exit_code != 0:
        raise SystemExit(f"rlkit data toy failed: {res.output}")
    return out / "train.parquet"


def tiny_model(out: Path) -> Path:
    from rlkit.testing import save_tiny_model

    return save_tiny_model(out / "tiny", tie_embeddings=True)


class Recorder:
    """A tracker for RLTrainer: keeps each step's metrics."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, metrics: dict, step: int) -> None:
        self.rows.append({"step": step, **metrics})


def overrides(args: argparse.Namespace, model: str, data: Path, scratch: Path) -> list[str]:
    return [
        f"data.train_files={data}",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_length}",
        f"data.max_response_length={args.response_length}",
        "data.truncation=left",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.rollout.name={args.rollout}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.micro_batch}",
        f"actor_rollout_ref.actor.use_kl_loss={not args.no_kl}",
        f"actor_rollout_ref.actor.recompute_old_log_prob={not args.no_recompute}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"trainer.n_gpus_per_node={args.workers}",
        f"trainer.cpus_per_worker={args.cpus_per_worker}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.default_local_dir={scratch / 'ckpt'}",
        "trainer.resume_mode=disable",
        "trainer.logger=[]",
        *args.set,
    ]


def run(args: argparse.Namespace) -> dict:
    import ray

    from rlkit.config.load import to_dict
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer

    with tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp:
        scratch = Path(tmp)
        model = args.model or str(tiny_model(scratch))
        data = Path(args.data) if args.data else toy_parquet(scratch / "toy", args.digits)
        cfg = load_config("grpo", overrides(args, model, data, scratch))
        ray.init(address="local", num_cpus=max(1, int(args.workers * args.cpus_per_worker)), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        rec = Recorder()
        started = time.perf_counter()
        trainer = RLTrainer(cfg, tracker=rec)
        setup_s = time.perf_counter() - started
        try:
            for step in range(1, args.steps + 1):
                trainer.global_step = step
                start = time.perf_counter()
                result = trainer.train_step()  # the rollout source draws the step's prompts
                step_s = time.perf_counter() - start
                rec.log(result.log_row(step_s, trainer.mfu_meter), step)
                print(f"step {step}/{args.steps}: {step_s:.2f}s", file=sys.stderr, flush=True)
        finally:
            trainer.workers.shutdown()
            ray.shutdown()
        return summarize(args, rec.rows, setup_s, model, to_dict(cfg))


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(args: argparse.Namespace, rows: list[dict], setup_s: float, model: str, cfg: dict) -> dict:
    timed = rows[1:] or rows  # step 1 warms up
    phases: dict[str, float | None] = {p: _median(timed, f"timing_s/{p}") for p in PHASES}
    if phases["gen"] is not None:  # the driver's gen timer wraps the reward call
        phases["gen"] = statistics.median(r["timing_s/gen"] - r.get("timing_s/reward", 0.0) for r in timed)
    step = _median(timed, "timing_s/step") or float("nan")
    rows_per_step = args.prompts * args.n
    resp_len = _median(timed, "response_length/mean") or 0.0
    gen_tok_s = statistics.median(
        r["response_length/mean"] * rows_per_step / (r["timing_s/gen"] - r.get("timing_s/reward", 0.0)) for r in timed
    )
    import torch

    return {
        "workload": {
            "model": model, "rollout": args.rollout, "prompts": args.prompts, "n": args.n,
            "sequences_per_step": rows_per_step, "max_prompt_length": args.prompt_length,
            "max_response_length": args.response_length, "kl_loss_ref": not args.no_kl,
            "recompute_old_log_prob": not args.no_recompute, "workers": args.workers,
            "cpus_per_worker": args.cpus_per_worker, "micro_batch": args.micro_batch, "steps": args.steps,
            "overrides": args.set,
        },
        "median_over_steps": f"2..{args.steps}" if len(rows) > 1 else "1",
        "phases_s": phases,
        "step_s": step,
        "other_s": statistics.median(
            r["timing_s/step"] - sum(r.get(f"timing_s/{p}", 0.0) for p in PHASES if p != "reward") for r in timed
        ),
        "tokens_per_s": _median(timed, "perf/throughput"),
        "mfu": _median(timed, "perf/mfu"),
        "gen_tokens_per_s": gen_tok_s,
        "response_length_mean": resp_len,
        "prompt_length_mean": _median(timed, "prompt_length/mean"),
        "setup_s": setup_s,
        "per_step": [{k: v for k, v in r.items() if k.startswith(KEEP_PER_STEP)} for r in rows],
        "env": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                "machine": platform.machine(), "cuda": torch.cuda.is_available(),
                "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "config": cfg,
    }


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    w = result["workload"]
    title = (f"GRPO step: {Path(w['model']).name or w['model']}, {w['rollout']} rollout, {w['prompts']} prompts x "
             f"{w['n']} = {w['sequences_per_step']} seqs, <= {w['max_response_length']} new tokens, "
             f"{w['workers']} worker(s) x {w['cpus_per_worker']:g} CPU")
    table = Table(title=title, caption=f"median over steps {result['median_over_steps']}")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("% of step", justify="right")
    step = result["step_s"]
    for name, sec in [*result["phases_s"].items(), ("other", result["other_s"])]:
        if sec is None:
            table.add_row(name, "-", "-")
        else:
            table.add_row(name, f"{sec:.3f}", f"{100 * sec / step:.1f}")
    table.add_row("[bold]step[/bold]", f"[bold]{step:.3f}[/bold]", "100.0", end_section=True)
    table.add_row("tokens/s (prompt+response / step)", f"{result['tokens_per_s']:.1f}", "")
    table.add_row("generated tokens/s (response / gen)", f"{result['gen_tokens_per_s']:.1f}", "")
    if result["mfu"] is not None:
        table.add_row("perf/mfu", f"{result['mfu']:.4f}", "")
    table.add_row("response length (mean)", f"{result['response_length_mean']:.1f}", "")
    table.add_row("setup (workers, models)", f"{result['setup_s']:.1f}", "")
    Console().print(table)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    result = run(args)
    print_table(result)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
