"""On-policy distillation vs the task reward alone on the toy copy task: learning curves and the teacher's cost.

    nice -n 19 .venv/bin/python bench/distill_curve.py [--steps 30] [--out bench/results/distill_curve]

The teacher is a tiny model trained in-process to copy the digit (`rlkit.testing.save_toy_copy_teacher`, greedy
accuracy 1.0); every variant starts from the same random student of the same shape and runs the same steps
(32 prompts x 8 samples, lr 5e-3, greedy validation every 5 steps):

* `distill_topk`: `rlkit train distill`, forward_kl_topk over the teacher's top 8, no task reward;
* `distill_k3`: the preset's default, the k3 reverse-KL estimator as a direct loss, no task reward;
* `distill_k1_pg`: k1 as a per-token reward under the PPO loss (use_policy_gradient), no task reward;
* `task_only`: GRPO on the task reward; the teacher still scores every token (distillation_loss_coef=0) so its
  KL is logged on the same scale, and so its time and memory are measured beside a run without it;
* `no_teacher`: the same GRPO run without distillation (the overhead's baseline).

Writes <out>.json (every variant's per-step KL, train score, greedy validation, step and teacher times, peak RSS
of the teacher call and of the update) and <out>.md (the table).

`--smollm2 STEPS` measures the teacher's cost at a real size instead: SmolLM2-135M-Instruct as the student and as
its own teacher (the only model on the machine; the same model, so the KL starts at ~0), GSM8K prompts, 4 x 2
samples of up to 64 tokens, against the same run without a teacher; writes <out>_smollm2.json / .md.
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
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RLKIT_CPU_COMPUTE_DTYPE", "float32")

VAL_KEY = "val/rlkit/toy_copy/score/mean@1"
DL = "distillation.distillation_loss."
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "distill_topk": ("distill", [f"{DL}loss_mode=forward_kl_topk", f"{DL}topk=8"]),
    "distill_k3": ("distill", []),
    "distill_k1_pg": ("distill", [f"{DL}loss_mode=k1", f"{DL}use_policy_gradient=true"]),
    "task_only": ("grpo", ["distillation.enabled=true", f"{DL}distillation_loss_coef=0.0",
                           f"{DL}use_task_rewards=true"]),
    "no_teacher": ("grpo", []),
}


def overrides(data: Path, student: Path, teacher: Path, out: Path, steps: int, extra: list[str],
              with_teacher: bool) -> list[str]:
    """The toy learning workload of tests/trainer/test_learning.py, validation every 5 steps."""
    base = [
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        "data.max_prompt_length=32", "data.max_response_length=3", "data.train_batch_size=32",
        f"actor_rollout_ref.model.path={student}", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64", "actor_rollout_ref.actor.optim.lr=5e-3",
        f"trainer.default_local_dir={out / 'ckpt'}", f"trainer.log_dir={out / 'logs'}", "trainer.resume_mode=disable",
        "trainer.logger=[file]", "trainer.n_gpus_per_node=1", "trainer.cpus_per_worker=1",
        "trainer.val_before_train=true", "trainer.test_freq=5", "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
    ]
    return base + extra + ([f"+distillation.teacher_models.teacher.model_path={teacher}"] if with_teacher else [])


def run(algo: str, ovr: list[str], log_dir: Path) -> list[dict]:
    import ray

    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    cfg = load_config(algo, ovr)
    with Tracking(["file"], log_dir=log_dir) as tracker:
        trainer = RLTrainer(cfg, tracker=tracker)
        try:
            trainer.fit()
        finally:
            trainer.workers.shutdown()
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarise(rows: list[dict]) -> dict:
    steps = [r for r in rows if "critic/score/mean" in r]
    vals = [(int(r.get("step", r.get("training/global_step", i))), r[VAL_KEY]) for i, r in enumerate(rows)
            if VAL_KEY in r]
    teacher = [r["timing_s/teacher"] for r in steps if "timing_s/teacher" in r]
    return {
        "kl": [r.get("actor/distill_loss") for r in steps],
        "score": [r["critic/score/mean"] for r in steps],
        "val": vals,
        "step_s_median": statistics.median(r["timing_s/step"] for r in steps),
        "teacher_s_median": statistics.median(teacher) if teacher else None,
        "teacher_rss_peak_gb": max((r.get("memory/compute_teacher_log_prob/rss_peak_gb", 0) for r in steps),
                                   default=None),
        "update_rss_peak_gb": max(r.get("memory/update_actor/rss_peak_gb", 0) for r in steps),
    }


def table(results: dict[str, dict]) -> str:
    def mean(xs: list) -> str:
        xs = [x for x in xs if x is not None]
        return f"{statistics.fmean(xs):.3f}" if xs else "-"

    lines = ["| variant | KL first 5 | KL last 5 | train score first 5 | last 5 | greedy val (every 5 steps) | "
             "step s | teacher s | teacher call RSS GB | update RSS GB |", "|" + "---|" * 10]
    for name, r in results.items():
        val = " ".join(f"{v:.2f}" for _, v in r["val"])
        ts = f"{r['teacher_s_median']:.3f}" if r["teacher_s_median"] is not None else "-"
        trss = f"{r['teacher_rss_peak_gb']:.2f}" if r["teacher_rss_peak_gb"] else "-"
        lines.append(f"| {name} | {mean(r['kl'][:5])} | {mean(r['kl'][-5:])} | {mean(r['score'][:5])} | "
                     f"{mean(r['score'][-5:])} | {val} | {r['step_s_median']:.2f} | {ts} | {trss} | "
                     f"{r['update_rss_peak_gb']:.2f} |")
    return "\n".join(lines)


def smollm2(steps: int, out: str) -> None:
    """The teacher's time and memory per step at 135M parameters (see the module docstring)."""
    from typer.testing import CliRunner

    from rlkit.models.resolve import resolve_model_path
    from rlkit_cli.main import app

    work = Path(tempfile.mkdtemp(prefix="distill_smollm2_"))
    res = CliRunner().invoke(app, ["data", "gsm8k", "--out", str(work / "gsm8k")])
    assert res.exit_code == 0, res.output
    model = str(resolve_model_path("smollm2-135m-instruct"))
    base = [f"data.train_files={work / 'gsm8k' / 'train.parquet'}", "data.val_files=null",
            "data.max_prompt_length=320", "data.truncation=left", "data.max_response_length=64",
            "data.train_batch_size=4",
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.optim.lr=1e-6",
            "trainer.resume_mode=disable", "trainer.logger=[file]", "trainer.n_gpus_per_node=1",
            "trainer.cpus_per_worker=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
            "trainer.save_freq=-1", f"trainer.total_training_steps={steps}"]
    results = {}
    for name, algo, extra in [("distill_self", "distill", [f"+distillation.teacher_models.teacher.model_path={model}"]),
                              ("no_teacher", "grpo", [])]:
        d = work / name
        rows = run(algo, base + extra + [f"trainer.default_local_dir={d / 'ckpt'}", f"trainer.log_dir={d / 'logs'}"],
                   d / "logs")
        steps_rows = [r for r in rows if "critic/score/mean" in r]
        results[name] = {k: statistics.median(r[k] for r in steps_rows) for k in steps_rows[-1]
                         if k.startswith(("timing_s/", "memory/")) or k == "actor/distill_loss"}
        print(name, json.dumps(results[name]), flush=True)
    keys = ["timing_s/step", "timing_s/teacher", "timing_s/update_actor", "timing_s/gen",
            "memory/compute_teacher_log_prob/rss_peak_gb", "memory/update_actor/rss_peak_gb"]
    lines = ["| run | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[k]:.3f}" if k in r else "-" for k in keys) + " |")
    text = "\n".join(lines)
    print(text)
    Path(out + "_smollm2.json").write_text(json.dumps({"steps": steps, "medians": results}, indent=1))
    Path(out + "_smollm2.md").write_text(f"# bench/distill_curve.py --smollm2 {steps} (medians over the steps)\n\n"
                                         f"{text}\n")


def main() -> None:
    import torch
    from typer.testing import CliRunner

    from rlkit.testing import save_tiny_model, save_toy_copy_teacher
    from rlkit_cli.main import app

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "distill_curve"))
    ap.add_argument("--smollm2", type=int, default=0, metavar="STEPS", help="measure SmolLM2-135M as its own teacher")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.smollm2:
        smollm2(args.smollm2, args.out)
        return
    work = Path(tempfile.mkdtemp(prefix="distill_curve_"))
    res = CliRunner().invoke(app, ["data", "toy", "--out", str(work / "toy"), "--length", "1"])
    assert res.exit_code == 0, res.output
    start = time.perf_counter()
    teacher = save_toy_copy_teacher(work / "teacher")
    teacher_s = time.perf_counter() - start
    student = save_tiny_model(work / "student", tie_embeddings=True)
    results = {}
    for name in args.variants.split(","):
        algo, extra = VARIANTS[name]
        out = work / name
        with_teacher = algo == "distill" or "distillation.enabled=true" in extra
        rows = run(algo, overrides(work / "toy", student, teacher, out, args.steps, extra, with_teacher), out / "logs")
        results[name] = summarise(rows)
        print(name, json.dumps({k: v for k, v in results[name].items() if k not in ("kl", "score")}), flush=True)
    text = table(results)
    print(text)
    Path(args.out + ".json").write_text(json.dumps({"steps": args.steps, "teacher_sft_s": teacher_s,
                                                    "results": results}, indent=1))
    Path(args.out + ".md").write_text(f"# bench/distill_curve.py ({args.steps} steps, toy copy task)\n\n{text}\n")


if __name__ == "__main__":
    main()
