"""Every objective of issue 34 trains the toy copy task end to end: one short real run per entry.

    .venv/bin/python bench/objectives.py                      # 60 steps each -> bench/results/objectives.json
    .venv/bin/python bench/objectives.py --steps 60 --entries cispo,gdpo   # rows merged into the file by entry

Task: `rlkit data toy --length 1` ("copy the digits : 7" -> "7"), a random tiny Llama with tied embeddings,
the `hf` rollout, 32 prompts x n=8 per step in two mini-batches of 16 prompts (two optimizer steps per batch,
so the second sees ratios r != 1 and each loss's clip / gate / truncation acts: on-policy with one update,
r = 1 and cispo, sapo, gpg, dppo_* give vanilla's gradient), micro-batches of 32 rows (4 per mini-batch, so
the loss scales must add up), a checkpoint every `--save-freq` steps and greedy validation on the 128 test
prompts before and after. Each entry is one `RLTrainer.fit` on a local Ray (the whole loop: rollout, reward,
advantages, micro-batched update, weight sync, checkpoint), from the same initial weights and prompts.
An entry "learns" when its mean training reward over the last 20 steps exceeds that of its first 10.
Rows of entries not run keep their place in the output file (a run replaces its entry's row); each row records the
load average at its start and end (`load_avg`), since the numbers come from a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VAL_KEY = "val/rlkit/toy_copy/score/mean@1"
A = "actor_rollout_ref.actor"

#: entry -> (preset, overrides): each new estimator / policy loss / aggregation mode with the settings it needs
ENTRIES: dict[str, tuple[str, dict]] = {
    "grpo (baseline)": ("grpo", {}),
    "cispo": ("cispo", {}),
    "sapo": ("sapo", {}),
    "geo_mean": ("gmpo", {}),
    "gpg": ("gpg", {}),
    "dppo_tv": ("grpo", {f"{A}.policy_loss": "dppo_tv"}),
    "dppo_kl": ("grpo", {f"{A}.policy_loss": "dppo_kl"}),
    "dro": ("grpo", {f"{A}.policy_loss": "dro", f"{A}.dro_beta": 0.1}),
    "clip_cov": ("grpo", {f"{A}.policy_loss": "clip_cov", f"{A}.clip_cov_ratio": 0.02}),
    "kl_cov": ("grpo", {f"{A}.policy_loss": "kl_cov", f"{A}.kl_cov_ratio": 0.02}),
    "grpo_passk": ("grpo", {"algorithm.adv_estimator": "grpo_passk"}),
    "opo": ("grpo", {"algorithm.adv_estimator": "opo"}),
    "gdpo": ("grpo", {"algorithm.adv_estimator": "gdpo", "algorithm.gdpo_reward_keys": "[exact]"}),
    "token-sum": ("grpo", {f"{A}.loss_agg_mode": "token-sum"}),
    "trl:luspo": ("grpo", {f"{A}.loss_type": "luspo"}),
    "vespo": ("grpo", {f"{A}.policy_loss": "vespo"}),
    "bypass_mode": ("grpo", {"algorithm.bypass_mode": True, "actor_rollout_ref.rollout.calculate_log_probs": True}),
    "optimal_token_baseline": ("grpo", {"algorithm.adv_estimator": "optimal_token_baseline"}),
    "tir_optimal_token_baseline": ("grpo", {"algorithm.adv_estimator": "tir_optimal_token_baseline"}),
}


def toy_overrides(data: Path, model: Path, out: Path, steps: int, save_freq: int, extra: dict) -> list[str]:
    values = {
        "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
        "data.max_prompt_length": 32, "data.max_response_length": 3, "data.train_batch_size": 32,
        "actor_rollout_ref.model.path": model, "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.n": 8, f"{A}.ppo_mini_batch_size": 16, f"{A}.ppo_micro_batch_size_per_gpu": 32,
        f"{A}.optim.lr": 5e-3, "trainer.default_local_dir": out / "ckpt", "trainer.log_dir": out / "logs",
        "trainer.resume_mode": "disable", "trainer.logger": "[file]", "trainer.n_gpus_per_node": 1,
        "trainer.cpus_per_worker": 1, "trainer.val_before_train": True, "trainer.save_freq": save_freq,
        "trainer.total_training_steps": steps, **extra,
    }
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


def run(preset: str, overrides: list[str], log_dir: Path) -> tuple[list[dict], dict, dict]:
    """Fit in this process on a local Ray (2 CPUs); returns (train rows, first val, last val)."""
    import ray

    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    cfg = load_config(preset, overrides)
    with Tracking(["file"], log_dir=log_dir) as tracker:
        trainer = RLTrainer(cfg, tracker=tracker)
        try:
            summary = trainer.fit()
        finally:
            trainer.workers.shutdown()
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "critic/score/mean" in r], summary.first_val, summary.last_val


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-freq", type=int, default=30)
    ap.add_argument("--entries", default=",".join(ENTRIES), help=f"comma-separated, of {', '.join(ENTRIES)}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "objectives.json"))
    args = ap.parse_args()
    names = args.entries.split(",")
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        ap.error(f"unknown entries {unknown}; choose from {list(ENTRIES)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"steps": args.steps, "save_freq": args.save_freq, "runs": []}
    if out.is_file():  # keep the other entries' rows (and their order); a run replaces its own
        kept = json.loads(out.read_text())
        if (kept.get("steps"), kept.get("save_freq")) != (args.steps, args.save_freq):
            ap.error(f"{out} holds runs of {kept.get('steps')} steps (save_freq {kept.get('save_freq')}): "
                     "use the same --steps/--save-freq or another --out")
        result["runs"] = kept.get("runs", [])
    print(f"{'entry':16s} {'preset':7s} {'first10':>8s} {'last20':>8s} {'val0':>6s} {'val1':>6s} {'ckpts':>5s} "
          f"{'wall':>6s}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rlkit-objectives-") as tmp:
        data, model = make_task(Path(tmp))
        for name in names:
            preset, extra = ENTRIES[name]
            run_dir = Path(tmp) / "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
            start, load_start = time.perf_counter(), os.getloadavg()[0]
            rows, first_val, last_val = run(
                preset, toy_overrides(data, model, run_dir, args.steps, args.save_freq, extra), run_dir / "logs")
            scores = [r["critic/score/mean"] for r in rows]
            ckpts = sorted(p.name for p in (run_dir / "ckpt").glob("global_step_*"))
            row = {
                "entry": name, "preset": preset, "overrides": {k: str(v) for k, v in extra.items()},
                "wall_s": round(time.perf_counter() - start, 1), "scores": [round(s, 4) for s in scores],
                "first10": statistics.fmean(scores[:10]), "last20": statistics.fmean(scores[-20:]),
                "val_before": first_val.get(VAL_KEY), "val_after": last_val.get(VAL_KEY), "checkpoints": ckpts,
                "learned": statistics.fmean(scores[-20:]) > statistics.fmean(scores[:10]),
                "load_avg": [round(load_start, 1), round(os.getloadavg()[0], 1)],
            }
            others = [r for r in result["runs"] if r["entry"] != name]
            at = next((i for i, r in enumerate(result["runs"]) if r["entry"] == name), len(others))
            result["runs"] = others[:at] + [row] + others[at:]
            out.write_text(json.dumps(result, indent=1))
            print(f"{name:16s} {preset:7s} {row['first10']:8.3f} {row['last20']:8.3f} {row['val_before']:6.3f} "
                  f"{row['val_after']:6.3f} {len(ckpts):5d} {row['wall_s']:5.0f}s", flush=True)
    ran = [r for r in result["runs"] if r["entry"] in names]
    print(f"{sum(r['learned'] for r in ran)}/{len(ran)} entries run learned; {len(result['runs'])} rows in {out}")


if __name__ == "__main__":
    main()
