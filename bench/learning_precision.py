"""Does bf16 compute learn as float32 does? The quickstart (or the toy copy task) over data seeds and precisions.

    .venv/bin/python bench/learning_precision.py --task quickstart --seeds 1 2 3
    .venv/bin/python bench/learning_precision.py --task toy --seeds 1 2 3 4 5
    .venv/bin/python bench/learning_precision.py --task toy --variants bf16 --seeds 1   # one cell

Each run is `rlkit train grpo` as a user starts it (the quickstart: recipes/quickstart_cpu.sh; the toy: the
test suite's toy copy task, tiny random model saved in bf16 as real checkpoints are), with the compute
precision of the actor and the engine set by `RLKIT_CPU_COMPUTE_DTYPE` (what `auto` would pick) and
`data.seed` varied. Variants: `fp32`, `bf16` (rlkit's default bf16 path), `bf16_nodither` (bf16 with
`fsdp_config.dither_master_weights=false`, the behaviour before the fix). Reported per run: mean train
reward of the first and last 5 steps, greedy validation score/accuracy before -> after, median step time,
the load. Results are appended to `--out` (JSON; reruns of a cell replace it), and the table and the
learning-curve plot are rewritten from all results each time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
VARIANTS = {
    "fp32": ("float32", []),
    "bf16": ("bfloat16", []),
    "bf16_nodither": ("bfloat16", ["actor_rollout_ref.actor.fsdp_config.dither_master_weights=false"]),
}
TOY_STEPS = 100


def toy_inputs(work: Path) -> tuple[Path, Path]:
    """The toy copy data and a tiny tied-embedding model stored in bf16 (as a pulled checkpoint is)."""
    sys.path.insert(0, str(ROOT))
    from rlkit.testing import save_tiny_model

    data, model = work / "toy", work / "tiny_bf16"
    if not (data / "train.parquet").exists():
        subprocess.run([str(ROOT / ".venv/bin/rlkit"), "data", "toy", "--out", str(data), "--length", "1"], check=True)
    if not model.exists():
        save_tiny_model(model, tie_embeddings=True, dtype="bfloat16")
    return data, model


def toy_command(work: Path, seed: int, logs: Path) -> list[str]:
    data, model = toy_inputs(work)
    overrides = {
        "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
        "data.max_prompt_length": 32, "data.max_response_length": 3, "data.train_batch_size": 32,
        "data.seed": seed, "actor_rollout_ref.model.path": model, "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.n": 8, "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64,
        "actor_rollout_ref.actor.optim.lr": 5e-3, "trainer.total_training_steps": TOY_STEPS,
        "trainer.default_local_dir": work / f"ckpt_{seed}", "trainer.log_dir": logs, "trainer.resume_mode": "disable",
        "trainer.logger": "[file]", "trainer.n_gpus_per_node": 1, "trainer.cpus_per_worker": 1,
        "trainer.val_before_train": True, "trainer.save_freq": -1,
    }
    return [str(ROOT / ".venv/bin/rlkit"), "train", "grpo", *(f"{k}={v}" for k, v in overrides.items())]


def quickstart_command(work: Path, seed: int, logs: Path) -> list[str]:
    return [
        "bash", str(ROOT / "recipes" / "quickstart_cpu.sh"), f"data.seed={seed}", f"trainer.log_dir={logs}",
        "trainer.logger=[file]", f"trainer.default_local_dir={work / f'ckpt_{seed}'}",
    ]


COMMANDS = {"quickstart": quickstart_command, "toy": toy_command}


def summarise(rows: list[dict]) -> dict:
    train = [r for r in rows if "critic/score/mean" in r]
    vals = [r for r in rows if any(k.startswith("val/") for k in r)]
    scores = [r["critic/score/mean"] for r in train]

    def val(row: dict, what: str) -> float | None:
        keys = sorted(k for k in row if k.startswith("val/") and f"/{what}/mean" in k)
        return row[keys[0]] if keys else None

    return {
        "steps": len(train),
        "train_first5": statistics.fmean(scores[:5]),
        "train_last5": statistics.fmean(scores[-5:]),
        "val_score": [val(vals[0], "score"), val(vals[-1], "score")] if vals else None,
        "val_acc": [val(vals[0], "acc"), val(vals[-1], "acc")] if vals else None,
        "median_step_s": statistics.median(r["timing_s/step"] for r in train),
        "curve": scores,
    }


def run_cell(task: str, variant: str, seed: int, work: Path) -> dict:
    dtype, extra = VARIANTS[variant]
    logs = work / f"logs_{task}_{variant}_{seed}"
    env = dict(os.environ, RLKIT_CPU_COMPUTE_DTYPE=dtype, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               TOKENIZERS_PARALLELISM="false")
    env.pop("RAY_ADDRESS", None)
    load = os.getloadavg()[0]
    start = time.time()
    out = subprocess.run([*COMMANDS[task](work, seed, logs), *extra], env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        tail = f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        raise SystemExit(f"{task}/{variant}/seed {seed} failed ({out.returncode}):\n{tail}")
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"task": task, "variant": variant, "dtype": dtype, "seed": seed, "wall_s": time.time() - start,
            "load_before": load, "load_after": os.getloadavg()[0], **summarise(rows)}


def table(results: list[dict]) -> str:
    lines = ["| task | variant | seed | train first5 -> last5 | val score before -> after | val acc before -> after "
             "| median step s | load |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["task"], r["variant"], r["seed"])):
        vs, va = r["val_score"] or [None, None], r["val_acc"] or [None, None]
        lines.append(
            f"| {r['task']} | {r['variant']} | {r['seed']} | {r['train_first5']:.3f} -> {r['train_last5']:.3f} "
            f"| {_f(vs[0])} -> {_f(vs[1])} | {_f(va[0])} -> {_f(va[1])} | {r['median_step_s']:.1f} "
            f"| {r['load_before']:.1f} |"
        )
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["task"], r["variant"]), []).append(r)
    lines += ["", "| task | variant | seeds | train last5 - first5 (mean, min..max) | val score after (mean) "
              "| median step s |", "|---|---|---|---|---|---|"]
    for (task, variant), rs in sorted(groups.items()):
        gains = [r["train_last5"] - r["train_first5"] for r in rs]
        after = [r["val_score"][1] for r in rs if r["val_score"] and r["val_score"][1] is not None]
        step_s = statistics.median(r["median_step_s"] for r in rs)
        lines.append(
            f"| {task} | {variant} | {len(rs)} | {statistics.fmean(gains):+.3f} ({min(gains):+.3f}..{max(gains):+.3f}) "
            f"| {_f(statistics.fmean(after)) if after else '-'} | {step_s:.1f} |"
        )
    return "\n".join(lines)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    tasks = sorted({r["task"] for r in results})
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    colours = {"fp32": "tab:blue", "bf16": "tab:green", "bf16_nodither": "tab:red"}
    for ax, task in zip(axes[0], tasks, strict=True):
        for variant in VARIANTS:
            curves = [r["curve"] for r in results if r["task"] == task and r["variant"] == variant]
            for i, c in enumerate(curves):
                ax.plot(range(1, len(c) + 1), c, color=colours[variant], alpha=0.35, label=variant if i == 0 else None)
            if curves:
                n = min(map(len, curves))
                ax.plot(range(1, n + 1), [statistics.fmean(c[s] for c in curves) for s in range(n)],
                        color=colours[variant], linewidth=2)
        ax.set_title(f"{task}: train reward per step (thin: seeds, thick: mean)")
        ax.set_xlabel("step")
        ax.set_ylabel("mean train reward")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(COMMANDS), default="quickstart")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--out", default=str(RESULTS / "learning_precision.json"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    results = json.loads(out.read_text())["runs"] if out.exists() else []
    work = Path(os.environ.get("RLKIT_BENCH_DIR", Path(tempfile.gettempdir()) / "rlkit_learning_precision"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    from rlkit.utils.cpu_precision import read_isa

    isa = read_isa().describe()
    for seed in args.seeds:  # seeds outermost: a cut-short run still compares the variants on the same seeds
        for variant in args.variants:
            print(f"learning_precision: {args.task} {variant} seed {seed} (load {os.getloadavg()[0]:.1f})", flush=True)
            cell = run_cell(args.task, variant, seed, work) | {"isa": isa}
            results = [r for r in results if (r["task"], r["variant"], r["seed"]) != (args.task, variant, seed)]
            results.append(cell)
            print(f"  train {cell['train_first5']:.3f} -> {cell['train_last5']:.3f}, val score {cell['val_score']}, "
                  f"acc {cell['val_acc']}, {cell['median_step_s']:.1f} s/step", flush=True)
            out.write_text(json.dumps({"measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": results}, indent=1))
            out.with_suffix(".md").write_text(table(results) + "\n")
            plot(results, out.with_suffix(".png"))
    print(table(results))


if __name__ == "__main__":
    main()
