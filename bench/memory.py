"""Where rlkit's memory goes on the `bench/vs_trl.py` workload, part by part, against TRL's peak RSS.

    .venv/bin/python bench/memory.py                                  # the default config, 2 steps -> table + JSON
    .venv/bin/python bench/memory.py --variants default,level1 --steps 2
    .venv/bin/python bench/memory.py --add before=RUN.json            # a saved `_rlkit_worker.py` result as a row
    .venv/bin/python bench/memory.py --report bench/results/memory.json

Each variant is one `bench/_rlkit_worker.py` run (the vs_trl workload, its rlkit-vllm row) with a few config
overrides or environment variables. RSS does not depend on the machine's load, so this runs on a busy machine;
2 steps suffice: step 1 allocates the optimizer state, step 2 runs every phase with it.

Columns, all GB, each the max over the run's steps:
- peak RSS: the summed RSS of the driver and the worker, sampled every 0.2 s (what vs_trl.py reports);
  "files once": the same with the file-backed pages (shared libraries) counted once, as in one process;
- driver / worker: each process's peak (`memory/driver/rss_peak_gb`, `memory/worker/rss_peak_gb`);
- the phases' peaks (`memory/<call>/rss_peak_gb`) and what each rose above its start (`rss_growth_gb`);
- the parts the roles hold: the actor's params, grads and AdamW state, the engine's weights while asleep and
  its KV cache while awake (`memory/actor/*`, `memory/rollout/*`).
TRL's peak RSS (`--trl-gb`) is its `bf16=True` run on the same workload (bench/results/vs_trl.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
DEFAULT_OUT = ROOT / "bench" / "results" / "memory.json"
# TRL bf16 autocast on this workload, AVX512-BF16 EPYC, 2026-12-01 (issue 36: "4.8 GB" in vs_trl's MB = MiB)
TRL_BF16_PEAK_GB = 4800 / 1024

# name -> (config overrides, environment); the default config first
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "default": ([], {}),
    "level1": (["actor_rollout_ref.rollout.sleep_level=1"], {}),  # the engine keeps its weights asleep
    "mmap1m": ([], {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}),  # glibc: every block >= 1 MiB its own mapping
    "fused_head": (["actor_rollout_ref.model.fused_lm_head=true"], {}),
}

PARTS = [  # (column, metric) in table order
    ("driver", "memory/driver/rss_peak_gb"), ("worker", "memory/worker/rss_peak_gb"),
    ("gen", "memory/generate_sequences/rss_peak_gb"), ("old lp", "memory/compute_log_prob/rss_peak_gb"),
    ("update", "memory/update_actor/rss_peak_gb"), ("update +", "memory/update_actor/rss_growth_gb"),
    ("sync", "memory/sync_weights/rss_peak_gb"), ("sync +", "memory/sync_weights/rss_growth_gb"),
    ("params", "memory/actor/params_gb"), ("grads", "memory/actor/grads_gb"),
    ("adam", "memory/actor/optimizer_state_gb"), ("eng w", "memory/rollout/weights_gb"),
    ("kv", "memory/rollout/kv_cache_gb"),
]


def run(name: str, overrides: list[str], env: dict[str, str], steps: int, out_dir: Path) -> dict:
    from vs_trl import ensure_data, model_dir

    out = out_dir / f"{name}.json"
    cmd = [sys.executable, str(ROOT / "bench" / "_rlkit_worker.py"), "--rollout", "vllm", "--model",
           model_dir("smollm2-135m-instruct"), "--data", str(ensure_data()), "--out", str(out), "--steps", str(steps),
           *overrides]
    print(f"memory: {name} ({' '.join(overrides) or 'defaults'} {env or ''}, load {os.getloadavg()[0]:.1f})",
          flush=True)
    with open(out_dir / f"{name}.log", "w") as log:
        subprocess.run(cmd, cwd=ROOT, env={**os.environ, "RAY_AUTH_MODE": "disabled", **env}, stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    return json.loads(out.read_text())


def summarize(raw: dict) -> dict:
    """One row: the peaks of the sampled processes and, per memory/* metric, its max over the steps."""
    row = {"peak_rss_gb": raw["peak_rss_mb"] / 1024,
           "peak_rss_files_once_gb": raw.get("peak_rss_shared_once_mb", float("nan")) / 1024,
           "step_s": sorted(r["timing_s/step"] for r in raw["steps"])[len(raw["steps"]) // 2],
           "steps": len(raw["steps"]), "overrides": raw.get("overrides", [])}
    for step in raw["steps"]:
        for key, value in step.items():
            if key.startswith("memory/"):
                row[key] = max(row.get(key, 0.0), value)
    return row


def table(rows: dict[str, dict], trl_gb: float) -> str:
    head = f"{'variant':11s} {'peak RSS':>8s} {'files 1x':>8s} {'/TRL':>5s} " + " ".join(f"{c:>8s}" for c, _ in PARTS)
    lines = [head, "-" * len(head)]
    for name, r in rows.items():
        cells = " ".join(f"{r[m]:8.2f}" if m in r else f"{'-':>8s}" for _, m in PARTS)
        lines.append(f"{name:11s} {r['peak_rss_gb']:8.2f} {r['peak_rss_files_once_gb']:8.2f} "
                     f"{r['peak_rss_gb'] / trl_gb:5.2f} {cells}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="default", help=f"comma-separated of {list(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--add", action="append", default=[], help="NAME=FILE: a saved _rlkit_worker.py result as a row")
    ap.add_argument("--trl-gb", type=float, default=TRL_BF16_PEAK_GB)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--merge", action="store_true", help="keep the rows already in --out")
    ap.add_argument("--report", default=None, help="only print the table of a saved JSON")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(table(saved["rows"], saved["meta"]["trl_peak_gb"]))
        return
    out = Path(args.out)
    rows: dict[str, dict] = json.loads(out.read_text())["rows"] if args.merge and out.exists() else {}
    for spec in args.add:
        name, _, path = spec.partition("=")
        rows[name] = summarize(json.loads(Path(path).read_text()))
    runs_dir = Path.home() / ".cache" / "rlkit" / "bench" / "runs" / "memory"
    runs_dir.mkdir(parents=True, exist_ok=True)
    for name in [n for n in args.variants.split(",") if n]:
        if name not in VARIANTS:
            sys.exit(f"unknown variant {name!r}; choose from {list(VARIANTS)}")
        overrides, env = VARIANTS[name]
        rows[name] = {**summarize(run(name, overrides, env, args.steps, runs_dir)), "env": env,
                      "load_avg": os.getloadavg()}
    meta = {"trl_peak_gb": args.trl_gb, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(table(rows, args.trl_gb))
    print(f"\nmemory: wrote {out} (raw runs in {runs_dir})")


if __name__ == "__main__":
    main()
