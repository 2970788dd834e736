"""SFT throughput: `rlkit train sft` vs TRL's SFTTrainer, same workload, same machine, alternating in one run.

    .venv/bin/python bench/sft_vs_trl.py                    # set-up of bench/.venv-trl (once) + both, 2 rounds
    .venv/bin/python bench/sft_vs_trl.py --report bench/results/sft_vs_trl.json

Workload (both): SmolLM2-135M-Instruct (the converted local folder), the first 64 GSM8K training conversations of
`rlkit data gsm8k --format sft` (the question as the user turn, the reference solution as the assistant turn), loss on
the assistant turn only, 8 conversations per optimizer step (one micro-batch), at most 512 tokens, lr 1e-5
constant, no gradient checkpointing, 6 steps; medians over steps 2-6. Each framework at its best precision on this
CPU: rlkit `param_dtype: auto` (bf16 where the CPU's bf16 matmul measures >= 1.3x fp32), TRL `bf16=True`
(autocast) on the same measurement, else float32. rlkit runs through the real CLI (Ray, one worker with the
machine's cores); its step time is the update call, TRL's one optimizer step (callback).

tokens/s = non-padding tokens of the step's conversations / step time. rlkit packs each micro-batch's
conversations into one row (no padding computed); TRL pads each batch to its longest row (its default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import (  # noqa: E402
    DATA_CACHE,
    ROOT,
    alternate,
    ensure_trl_venv,
    model_dir,
    print_report,
    trl_best_precision,
)

DEFAULT_OUT = ROOT / "bench" / "results" / "sft_vs_trl.json"
ROWS, BATCH, MAX_LEN = 64, 8, 512


def ensure_sft_data(rows: int = ROWS) -> Path:
    out = DATA_CACHE / f"gsm8k_sft_{rows}.parquet"
    if out.exists():
        return out
    import pandas as pd

    full = DATA_CACHE / "gsm8k_sft"
    if not (full / "train.parquet").exists():
        subprocess.run([sys.executable, "-m", "rlkit_cli.main", "data", "gsm8k", "--format", "sft", "--out",
                        str(full)], check=True, cwd=ROOT)
    pd.read_parquet(full / "train.parquet").iloc[:rows].to_parquet(out)
    return out


def run_rlkit(model: str, data: Path, steps: int, out_dir: Path) -> dict:
    ckpt = out_dir / "rlkit-ckpt"
    cmd = [sys.executable, "-m", "rlkit_cli.main", "train", "sft", f"model.path={model}", f"data.train_files={data}",
           "data.messages_key=messages", f"data.train_batch_size={BATCH}", f"data.micro_batch_size_per_gpu={BATCH}",
           "data.use_dynamic_bsz=false", f"data.max_length={MAX_LEN}", "data.truncation=right", "data.shuffle=false",
           "optim.lr=1e-5", "model.enable_gradient_checkpointing=false", f"trainer.total_training_steps={steps}",
           "trainer.val_before_train=false", "trainer.logger=[file]", f"trainer.default_local_dir={ckpt}",
           "trainer.resume_mode=disable", f"trainer.cpus_per_worker={os.cpu_count()}", "trainer.save_freq=100000"]
    log = out_dir / "rlkit.log"
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    if proc.returncode:
        raise RuntimeError(f"rlkit failed (exit {proc.returncode}); see {log}")
    rows = [json.loads(line) for line in (ckpt / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps_out = [{"step": r["step"], "step_s": r["timing_s/update"], "tokens": r["train/tokens"],
                  "rss_gb": r.get("memory/train_batch/rss_peak_gb")} for r in rows if "train/tokens" in r]
    peak = max((s["rss_gb"] or 0) for s in steps_out) * 1024
    return {"framework": "rlkit", "steps": steps_out, "peak_rss_mb": peak}


def run_trl(py: Path, model: str, data: Path, steps: int, out_dir: Path, bf16: bool) -> dict:
    out = out_dir / "trl.json"
    cmd = [str(py), str(ROOT / "bench" / "_trl_sft_worker.py"), "--model", model, "--data", str(data), "--out",
           str(out), "--steps", str(steps), "--batch", str(BATCH), "--max-length", str(MAX_LEN),
           *(["--bf16"] if bf16 else [])]
    log = out_dir / "trl.log"
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"TRL failed (exit {proc.returncode}); see {log}")
    return json.loads(out.read_text())


def summarize(raw: dict) -> dict:
    rows = [s for s in raw["steps"] if s["step"] >= 2]
    return {"step_s": statistics.median(s["step_s"] for s in rows),
            "tokens_per_s": statistics.median(s["tokens"] / s["step_s"] for s in rows),
            "tokens_per_step": statistics.median(s["tokens"] for s in rows), "peak_rss_mb": raw.get("peak_rss_mb")}


def table(result: dict) -> str:
    lines = [f"{'framework':10s} {'round':>5s} {'step s':>7s} {'tokens/step':>11s} {'tokens/s':>9s} "
             f"{'peak RSS MB':>11s}"]
    for name, runs in result["runs"].items():
        for i, s in enumerate(runs):
            lines.append(f"{name:10s} {i + 1:5d} {s['step_s']:7.2f} {s['tokens_per_step']:11.0f} "
                         f"{s['tokens_per_s']:9.1f} {s['peak_rss_mb'] or 0:11.0f}")
    med = {n: statistics.median(r["tokens_per_s"] for r in runs) for n, runs in result["runs"].items()}
    if {"rlkit", "trl"} <= set(med):
        lines.append(f"rlkit / TRL tokens/s (medians over rounds): {med['rlkit'] / med['trl']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--report", default=None)
    args = ap.parse_args()
    if args.report:
        print_report(args.report, table)
        return
    py, data, model = ensure_trl_venv(), ensure_sft_data(), model_dir(args.model)
    precision = trl_best_precision()
    result = {"meta": {"cpus": os.cpu_count(), "trl_precision": precision, "rlkit_precision": "param_dtype auto",
                       "load_avg_start": os.getloadavg(), "rows": ROWS, "batch": BATCH, "max_length": MAX_LEN},
              "runs": {"rlkit": [], "trl": []}}

    def run(name: str, out_dir: Path) -> dict:
        return (run_trl(py, model, data, args.steps, out_dir, precision == "bf16") if name == "trl"
                else run_rlkit(model, data, args.steps, out_dir))

    alternate("sft_vs_trl", ["trl", "rlkit"], args.rounds, run, summarize, result, Path(args.out))
    print(table(result))


if __name__ == "__main__":
    main()
