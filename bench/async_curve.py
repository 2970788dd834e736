"""Reward against wall time: synchronous (hybrid engine) vs one-step-off-policy vs fully async, on the toy copy task.

    .venv/bin/python bench/async_curve.py                 # 250 steps each -> bench/results/async_curve.json (+ .png)
    .venv/bin/python bench/async_curve.py --steps 100 --seeds 1,2 --modes sync,fully_async

Task: `rlkit data toy --length 1` ("copy the digits : 7" -> "7"), a random tiny Llama with tied
embeddings (`rlkit.testing.save_tiny_model`), GRPO with the `hf` rollout, n=8, 16 prompts per
step, lr 5e-3, 1 CPU per worker: the synchronous run is one worker (actor + rollout colocated);
the async runs are an actor worker plus a rollout worker (2 CPUs in all). one_step_off overlaps
the generation of batch k+1 with the update on batch k; fully_async streams chunks of 4 prompts
from a rollout pump, at most `--staleness` versions old, in segments of `--segment` tokens (partial
rollouts; 0 = whole responses, the default); both correct with truncated IS on the rollout's
log-probs. All runs see the same prompts in the same order. Curves: the training reward (20-step
moving mean) against the run's wall time (the sum of its step times), plus greedy validation on
the 128 test prompts at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VAL_KEY = "val/rlkit/toy_copy/score/mean@1"


#: the overrides of each mode (on top of the synchronous run's)
MODES: dict[str, dict] = {
    "sync": {},
    "one_step_off": {"trainer.one_step_off_policy": True},
    "fully_async": {"trainer.fully_async": True, "trainer.rollout_chunk_prompts": 4},
}


def toy_overrides(data: Path, model: Path, out: Path, steps: int, seed: int, mode: str, staleness: int = 1,
                  segment: int = 0) -> list[str]:
    values = {
        "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
        "data.max_prompt_length": 32, "data.max_response_length": 3, "data.train_batch_size": 16,
        "data.seed": seed, "actor_rollout_ref.model.path": model, "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.n": 8, "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64, "actor_rollout_ref.actor.optim.lr": 5e-3,
        "trainer.default_local_dir": out / "ckpt", "trainer.log_dir": out / "logs", "trainer.resume_mode": "disable",
        "trainer.logger": "[file]", "trainer.n_gpus_per_node": 1, "trainer.cpus_per_worker": 1,
        "trainer.rollout_cpus_per_worker": 1, "trainer.val_before_train": True, "trainer.save_freq": -1,
        "trainer.total_training_steps": steps, "trainer.seed": seed, **MODES[mode],
    }
    if mode == "fully_async":
        values |= {"trainer.staleness_threshold": staleness, "trainer.partial_rollout_segment": segment}
    return [f"{k}={v}" for k, v in values.items()]


def make_task(root: Path) -> tuple[Path, Path]:
    from typer.testing import CliRunner

    from rlkit.testing import save_tiny_model
    from rlkit_cli.main import app

    data = root / "toy"
    res = CliRunner().invoke(app, ["data", "toy", "--out", str(data), "--length", "1"])
    if res.exit_code != 0:
        raise RuntimeError(res.output)
    return data, save_tiny_model(root / "tiny", tie_embeddings=True)


def run(overrides: list[str], log_dir: Path) -> tuple[list[dict], dict, dict]:
    """Fit in this process on a local Ray (2 CPUs); returns (train rows, first val, last val)."""
    import ray

    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    cfg = load_config("grpo", overrides)
    with Tracking(["file"], log_dir=log_dir) as tracker:
        trainer = RLTrainer(cfg, tracker=tracker)
        try:
            summary = trainer.fit()
        finally:
            trainer.workers.shutdown()
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "critic/score/mean" in r], summary.first_val, summary.last_val


def moving_mean(xs: list[float], k: int = 20) -> list[float]:
    return [statistics.fmean(xs[max(0, i - k + 1): i + 1]) for i in range(len(xs))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--staleness", type=int, default=1, help="fully_async: trainer.staleness_threshold")
    ap.add_argument("--segment", type=int, default=0, help="fully_async: trainer.partial_rollout_segment (0: whole)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "async_curve.json"))
    args = ap.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    result: dict = {"steps": args.steps, "staleness": args.staleness, "segment": args.segment, "runs": []}
    with tempfile.TemporaryDirectory(prefix="rlkit-async-curve-") as tmp:
        data, model = make_task(Path(tmp))
        for seed in (int(s) for s in args.seeds.split(",")):
            for mode in modes:
                out = Path(tmp) / f"{mode}-{seed}"
                start = time.perf_counter()
                overrides = toy_overrides(data, model, out, args.steps, seed, mode, args.staleness, args.segment)
                rows, first_val, last_val = run(overrides, out / "logs")
                scores = [r["critic/score/mean"] for r in rows]
                step_s = [r["timing_s/step"] for r in rows]
                run_row = {
                    "mode": mode, "seed": seed, "wall_s": time.perf_counter() - start,
                    "median_step_s": statistics.median(step_s[1:]), "scores": [round(s, 4) for s in scores],
                    "elapsed_s": [round(t, 3) for t in itertools.accumulate(step_s)],
                    "val_before": first_val.get(VAL_KEY), "val_after": last_val.get(VAL_KEY),
                    "first10": statistics.fmean(scores[:10]), "last20": statistics.fmean(scores[-20:]),
                }
                if "rollout/staleness/mean" in rows[-1]:
                    run_row["staleness_mean"] = statistics.fmean(r["rollout/staleness/mean"] for r in rows)
                    run_row["dropped_stale"] = rows[-1]["rollout/dropped_stale_total"]
                result["runs"].append(run_row)
                print(f"{mode:12s} seed {seed}: train reward first 10 {run_row['first10']:.3f} -> last 20 "
                      f"{run_row['last20']:.3f}; greedy val {run_row['val_before']:.3f} -> {run_row['val_after']:.3f}; "
                      f"median step {run_row['median_step_s']:.3f}s; steps {run_row['elapsed_s'][-1]:.0f}s; "
                      f"wall {run_row['wall_s']:.0f}s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out}")


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for run_row in result["runs"]:
        label = f"{run_row['mode']} (seed {run_row['seed']}, {run_row['median_step_s']:.2f} s/step)"
        ax.plot(run_row.get("elapsed_s", range(len(run_row["scores"]))), moving_mean(run_row["scores"]), label=label)
    ax.set_xlabel("wall time of the steps (s)")
    ax.set_ylabel("train reward (20-step moving mean)")
    ax.set_title("GRPO on the toy copy task: sync vs one-step-off vs fully async")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
