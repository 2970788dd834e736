"""DPO throughput: `rlkit train dpo` vs TRL's DPOTrainer, same pairs, same machine, alternating in one run.

    .venv/bin/python bench/dpo_vs_trl.py                    # set-up of bench/.venv-trl (once) + all four, 2 rounds
    .venv/bin/python bench/dpo_vs_trl.py --frameworks rlkit --model /tmp/tiny --steps 3 --out /tmp/smoke.json
    .venv/bin/python bench/dpo_vs_trl.py --report bench/results/dpo_vs_trl.json

Workload (both): SmolLM2-135M-Instruct (the converted local folder); 64 preference pairs built deterministically from
the first 64 GSM8K training rows (../shared/data/gsm8k/train.jsonl): prompt = the question (one user turn), chosen =
its reference solution, rejected = the next row's reference solution (fluent, well formed, but the answer to another
question; row 63 takes row 0's). One conversational parquet file (rlkit.data.preference_schema; TRL's
conversational preference format) is read by both, each applying the chat template. 8 pairs per optimizer step (one
micro-batch), at most 512 tokens per sequence and 256 per prompt, sigmoid loss, beta 0.1, lr 1e-6 constant, no weight
decay (TRL's default), no gradient checkpointing, 6 steps; medians over steps 2-6. Each framework at its best
precision on this CPU (as bench/sft_vs_trl.py: rlkit `param_dtype: auto`, TRL `bf16=True` where the same measurement
finds bf16 faster).

Each framework twice: the reference scored every step (rlkit's frozen copy in the worker, TRL's `ref_model` copy),
and precomputed (rlkit `dpo.ref.precompute=true`, TRL `precompute_ref_log_probs=True`). Step time: rlkit's reference
phase + update (`timing_s/ref` + `timing_s/update`), TRL's optimizer step (callback); pairs/s = 8 / step time.
Peak RSS: the process's high-water mark over the run (rlkit's one worker, `memory/worker/rss_peak_gb`; TRL's
ru_maxrss), and rlkit's peak during its steps (`memory/train_batch/rss_peak_gb`: after the precompute released the
reference). The precompute's own time: rlkit's start-up log line, TRL's train() up to its first step.
rlkit packs each micro-batch's sequences (no padding computed); TRL pads each batch (its default).
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

DEFAULT_OUT = ROOT / "bench" / "results" / "dpo_vs_trl.json"
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
ROWS, BATCH, MAX_LEN, MAX_PROMPT, LR, BETA = 64, 8, 512, 256, 1e-6, 0.1
VARIANTS = {"trl": ("trl", False), "rlkit": ("rlkit", False), "trl-precompute": ("trl", True),
            "rlkit-precompute": ("rlkit", True)}  # name -> (framework, precomputed reference); run in this order


def gsm8k_pairs(source: Path, rows: int = ROWS) -> list[dict]:
    """(question, its solution, the next question's solution) as conversational preference pairs."""
    items = [json.loads(line) for line in source.read_text().splitlines()[:rows]]
    return [{"prompt": [{"role": "user", "content": item["question"]}],
             "chosen": [{"role": "assistant", "content": item["answer"]}],
             "rejected": [{"role": "assistant", "content": items[(i + 1) % len(items)]["answer"]}]}
            for i, item in enumerate(items)]


def ensure_pairs(source: Path, rows: int = ROWS) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = DATA_CACHE / f"gsm8k_dpo_{rows}.parquet"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(gsm8k_pairs(source, rows)), out)
    return out


def run_rlkit(model: str, data: Path, steps: int, out_dir: Path, precompute: bool) -> dict:
    ckpt = out_dir / "rlkit-ckpt"
    cmd = [sys.executable, "-m", "rlkit_cli.main", "train", "dpo", f"model.path={model}", f"data.train_files={data}",
           f"data.train_batch_size={BATCH}", f"data.micro_batch_size_per_gpu={BATCH}", "data.use_dynamic_bsz=false",
           f"data.max_length={MAX_LEN}", f"dpo.max_prompt_length={MAX_PROMPT}", "data.truncation=right",
           "data.shuffle=false", f"optim.lr={LR}", "optim.lr_warmup_steps=0", "optim.weight_decay=0.0",
           f"dpo.beta={BETA}",
           f"dpo.ref.precompute={str(precompute).lower()}", "model.enable_gradient_checkpointing=false",
           f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.logger=[file]",
           f"trainer.default_local_dir={ckpt}", "trainer.resume_mode=disable",
           f"trainer.cpus_per_worker={os.cpu_count()}", "trainer.save_freq=100000"]
    log = out_dir / "rlkit.log"
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    if proc.returncode:
        raise RuntimeError(f"rlkit failed (exit {proc.returncode}); see {log}")
    rows = [json.loads(line) for line in (ckpt / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps_out = [{"step": r["step"], "step_s": r.get("timing_s/ref", 0.0) + r["timing_s/update"],
                  "ref_s": r.get("timing_s/ref", 0.0), "step_rss_gb": r.get("memory/train_batch/rss_peak_gb"),
                  "worker_rss_gb": r.get("memory/worker/rss_peak_gb")} for r in rows if "timing_s/update" in r]
    scored = re.search(r"pairs scored in ([0-9.]+)s .* ([0-9.]+) MiB of weights freed", log.read_text())
    return {"framework": "rlkit", "steps": steps_out, "precompute": precompute,
            "peak_rss_mb": max((s["worker_rss_gb"] or 0) for s in steps_out) * 1024,
            "step_peak_rss_mb": max((s["step_rss_gb"] or 0) for s in steps_out) * 1024,
            "precompute_s": float(scored.group(1)) if scored else None,
            "ref_freed_mb": float(scored.group(2)) if scored else None}


def run_trl(py: Path, model: str, data: Path, steps: int, out_dir: Path, bf16: bool, precompute: bool) -> dict:
    out = out_dir / "trl.json"
    cmd = [str(py), str(ROOT / "bench" / "_trl_dpo_worker.py"), "--model", model, "--data", str(data), "--out",
           str(out), "--steps", str(steps), "--batch", str(BATCH), "--max-length", str(MAX_LEN),
           "--max-prompt-length", str(MAX_PROMPT), "--lr", str(LR), "--beta", str(BETA),
           *(["--bf16"] if bf16 else []), *(["--precompute"] if precompute else [])]
    log = out_dir / "trl.log"
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"TRL failed (exit {proc.returncode}); see {log}")
    raw = json.loads(out.read_text())
    raw["precompute_s"] = raw.pop("before_first_step_s") if precompute else None
    return raw


def summarize(raw: dict) -> dict:
    rows = [s for s in raw["steps"] if s["step"] >= 2] or raw["steps"]
    step_s = statistics.median(s["step_s"] for s in rows)
    return {"step_s": step_s, "pairs_per_s": statistics.median(BATCH / s["step_s"] for s in rows),
            "ref_s": statistics.median(s.get("ref_s", float("nan")) for s in rows),
            "peak_rss_mb": raw.get("peak_rss_mb"), "step_peak_rss_mb": raw.get("step_peak_rss_mb"),
            "precompute_s": raw.get("precompute_s"), "ref_freed_mb": raw.get("ref_freed_mb"),
            "dropped_keys": raw.get("dropped_keys")}


def table(result: dict) -> str:
    lines = [f"{'variant':17s} {'round':>5s} {'step s':>7s} {'pairs/s':>8s} {'peak RSS MB':>11s} "
             f"{'step RSS MB':>11s} {'precompute s':>12s}"]
    for name, runs in result["runs"].items():
        for i, s in enumerate(runs):
            pre = f"{s['precompute_s']:12.1f}" if s.get("precompute_s") is not None else f"{'-':>12s}"
            lines.append(f"{name:17s} {i + 1:5d} {s['step_s']:7.2f} {s['pairs_per_s']:8.2f} "
                         f"{s['peak_rss_mb'] or 0:11.0f} {s['step_peak_rss_mb'] or 0:11.0f} {pre}")
    med = {n: statistics.median(r["pairs_per_s"] for r in runs) for n, runs in result["runs"].items() if runs}
    for ours, theirs in (("rlkit", "trl"), ("rlkit-precompute", "trl-precompute")):
        if {ours, theirs} <= set(med):
            lines.append(f"{ours} / {theirs} pairs/s (medians over rounds): {med[ours] / med[theirs]:.2f}x")
    meta = result["meta"]
    lines.append(f"load average: start {meta['load_avg_start']}, end {meta.get('load_avg_end')}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--gsm8k", default=str(GSM8K), help="GSM8K train.jsonl (question, answer) the pairs come from")
    ap.add_argument("--frameworks", default="rlkit,trl", help="which halves run: rlkit, trl or both")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--report", default=None)
    args = ap.parse_args()
    if args.report:
        print_report(args.report, table)
        return
    frameworks = set(args.frameworks.split(","))
    variants = [n for n, (fw, _) in VARIANTS.items() if fw in frameworks]
    py = ensure_trl_venv() if "trl" in frameworks else None
    data, model = ensure_pairs(Path(args.gsm8k)), model_dir(args.model)
    precision = trl_best_precision()
    result = {"meta": {"cpus": os.cpu_count(), "trl_precision": precision, "rlkit_precision": "param_dtype auto",
                       "load_avg_start": os.getloadavg(), "rows": ROWS, "batch": BATCH, "max_length": MAX_LEN,
                       "max_prompt_length": MAX_PROMPT, "lr": LR, "beta": BETA, "model": model,
                       "rejected": "the next GSM8K row's reference solution"},
              "runs": {name: [] for name in variants}}

    def run(name: str, out_dir: Path) -> dict:
        framework, precompute = VARIANTS[name]
        return (run_trl(py, model, data, args.steps, out_dir, precision == "bf16", precompute)
                if framework == "trl" else run_rlkit(model, data, args.steps, out_dir, precompute))

    alternate("dpo_vs_trl", variants, args.rounds, run, summarize, result, Path(args.out))
    print(table(result))


if __name__ == "__main__":
    main()
