"""rlkit vs TRL's GRPOTrainer, same workload, same machine.

    .venv/bin/python bench/vs_trl.py                     # set-up (once) + all variants -> table + JSON
    .venv/bin/python bench/vs_trl.py --variants trl,rlkit-vllm --rounds 2
    .venv/bin/python bench/vs_trl.py --report bench/results/vs_trl.json   # print the table of a saved run

Precision: each framework at its best on the CPU at hand. rlkit's actor uses `param_dtype: auto`
(bf16 where this CPU's bf16 matmul measures >= 1.3x fp32, rlkit/utils/cpu_precision.py); the TRL rows
`trl`, `trl-kl`, `trl-defaults` run with `bf16=True` (fp32 weights, bf16 autocast, what a TRL user on
such a CPU sets) on the same measurement, float32 otherwise. `trl-fp32` / `trl-bf16` pin one precision
(`--variants trl-fp32,trl-bf16,...` gives both rows); the table's header line says which ran.

Workload (both frameworks): SmolLM2-135M-Instruct (the converted local folder, fp32 weights), the first
20 GSM8K training prompts in order, 4 prompts x 4 samples per step, at most 128 new tokens,
temperature 1.0 (no top-k/top-p), rlkit's gsm8k scorer as the reward, lr 1e-6 (constant),
one optimizer step per generation batch, 5 steps; the KL variants add a frozen reference
(TRL beta=0.04, rlkit use_kl_loss with kl_loss_coef=0.04, both the k3 estimator).
Reported numbers are medians over steps 2-5 (step 1 includes warm-up).

Set-up: TRL lives in its own venv, bench/.venv-trl, created on first use: torch==2.13.0
(the CPU wheel) first, then trl with transformers pinned to the version rlkit uses, so no CUDA
torch is pulled and both run the same model code. No vLLM there: TRL generates with
transformers `generate` (its default without a vLLM server). rlkit runs in its own venv
(this interpreter) through the real fit loop on Ray, one worker with 2 CPUs; `rlkit-hf` swaps
its vLLM engine for the transformers backend, so engine and pipeline are each visible.

TRL runs with gradient_checkpointing=False, like rlkit. TRL's own default (True) also makes
transformers drop the KV cache inside `generate` while the model is in train mode, so every new
token recomputes the whole sequence; `trl-defaults` measures that configuration. The ratio column
always compares with `trl` / `trl-kl` (no checkpointing).

Columns: step, gen (generation only), reward (scoring), train (= step - gen - reward: log-prob
and reference passes, advantages, the update, the weight sync, framework overhead), resp
tok/s (response tokens of the step / step time), CPU s/step (user+sys of all the run's
processes, less sensitive than wall time to other load on a shared machine), peak RSS (TRL:
its process; rlkit: driver + worker, Ray's daemons apart), and the ratio rlkit/TRL of step
time against the TRL run with the same reference setting (on the `trl-defaults` row: rlkit-vllm
against TRL's default configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TRL_VENV = BENCH / ".venv-trl"
TRL_PINS = ["trl==1.13.0", "accelerate", "datasets", "pandas", "pyarrow", "psutil", "requests"]
TORCH_PIN = "torch==2.13.0"
DATA_CACHE = Path.home() / ".cache" / "rlkit" / "bench"
DEFAULT_OUT = BENCH / "results" / "vs_trl.json"
KL_COEF = 0.04
COMPILED_ENGINE = ["actor_rollout_ref.rollout.enforce_eager=false"]  # vLLM's compiled model; rlkit's default is eager

# name -> (framework, options); order = run order (TRL and rlkit interleaved to spread machine noise)
VARIANTS: dict[str, tuple[str, dict]] = {
    "trl": ("trl", {"beta": 0.0}),
    "trl-defaults": ("trl", {"beta": 0.0, "extra": ["--gradient-checkpointing"]}),  # TRL's default config
    "rlkit-vllm": ("rlkit", {"rollout": "vllm", "kl": 0.0}),
    "rlkit-hf": ("rlkit", {"rollout": "hf", "kl": 0.0}),
    "rlkit-vllm-async": ("rlkit", {"rollout": "vllm", "kl": 0.0, "extra": [
        "trainer.one_step_off_policy=true", "trainer.cpus_per_worker=1", "trainer.rollout_cpus_per_worker=1"]}),
    "trl-kl": ("trl", {"beta": KL_COEF}),
    "trl-fp32": ("trl", {"beta": 0.0, "precision": "fp32"}),
    "trl-bf16": ("trl", {"beta": 0.0, "precision": "bf16"}),
    "rlkit-vllm-kl": ("rlkit", {"rollout": "vllm", "kl": KL_COEF}),
    "rlkit-hf-kl": ("rlkit", {"rollout": "hf", "kl": KL_COEF}),
    "rlkit-vllm-compiled": ("rlkit", {"rollout": "vllm", "kl": 0.0, "extra": COMPILED_ENGINE}),  # not a default row
    "rlkit-vllm-kl-compiled": ("rlkit", {"rollout": "vllm", "kl": KL_COEF, "extra": COMPILED_ENGINE}),
}
DEFAULT_VARIANTS = ["trl", "rlkit-vllm", "rlkit-hf", "rlkit-vllm-async", "trl-kl", "rlkit-vllm-kl", "trl-defaults"]


# ------------------------------------------------------------------ set-up
def transformers_version() -> str:
    from importlib.metadata import version

    return version("transformers")


def ensure_trl_venv(venv: Path = TRL_VENV) -> Path:
    """bench/.venv-trl with torch (CPU wheel) installed first, then TRL; returns its python."""
    py = venv / "bin" / "python"
    stamp = venv / ".rlkit-bench-stamp"
    want = " ".join([TORCH_PIN, *TRL_PINS, f"transformers=={transformers_version()}"])
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    print(f"vs_trl: setting up {venv} ({want})", flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH_PIN], check=True)
    subprocess.run([*pip, TORCH_PIN, f"transformers=={transformers_version()}", *TRL_PINS], check=True)
    stamp.write_text(want)
    return py


def ensure_data(rows: int = 20) -> Path:
    """The first `rows` GSM8K training prompts (rlkit's common schema), made with `rlkit data gsm8k`."""
    out = DATA_CACHE / f"gsm8k_{rows}.parquet"
    if out.exists():
        return out
    import pandas as pd

    full = DATA_CACHE / "gsm8k"
    if not (full / "train.parquet").exists():
        subprocess.run([sys.executable, "-m", "rlkit_cli.main", "data", "gsm8k", "--out", str(full)], check=True,
                       cwd=ROOT)
    DATA_CACHE.mkdir(parents=True, exist_ok=True)
    pd.read_parquet(full / "train.parquet").iloc[:rows].to_parquet(out)
    return out


def model_dir(name: str) -> str:
    from rlkit.models.resolve import resolve_model_path

    return str(resolve_model_path(name))


# ------------------------------------------------------------------ runs
def run_variant(name: str, model: str, data: Path, steps: int, out_dir: Path, trl_py: Path | None) -> dict:
    framework, opts = VARIANTS[name]
    out = out_dir / f"{name}.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    if framework == "trl":
        assert trl_py is not None
        bf16 = opts.get("precision", trl_best_precision()) == "bf16"
        cmd = [str(trl_py), str(BENCH / "_trl_worker.py"), "--beta", str(opts["beta"]), *opts.get("extra", []),
               *(["--bf16"] if bf16 else [])]
    else:
        cmd = [sys.executable, str(BENCH / "_rlkit_worker.py"), "--rollout", opts["rollout"],
               "--kl-coef", str(opts["kl"]), *opts.get("extra", [])]
    cmd += ["--model", model, "--data", str(data), "--out", str(out), "--steps", str(steps)]
    print(f"vs_trl: {name}: {' '.join(cmd[1:3])} ... (load {os.getloadavg()[0]:.1f})", flush=True)
    log = out_dir / f"{name}.log"
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{name} failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
    raw = json.loads(out.read_text())
    raw["wall_s"] = time.perf_counter() - start
    return raw


def _steps(raw: dict) -> list[dict]:
    """Per-step rows in one shape: step_s, gen_s, reward_s, cpu_s, response tokens."""
    rows = []
    for r in raw["steps"]:
        if raw["framework"] == "trl":
            length = r.get("response_length_mean") or float("nan")
            rows.append({"step": r["step"], "step_s": r["step_s"], "gen_s": r["gen_s"], "reward_s": r["reward_s"],
                         "cpu_s": r["cpu_s"], "resp_tokens": 16 * length, "load": r.get("load_avg_1m")})
        else:
            reward = r.get("timing_s/reward", 0.0)
            gen = r.get("timing_s/gen_only", r.get("timing_s/gen", 0.0) - reward)
            rows.append({"step": r["step"], "step_s": r["timing_s/step"], "gen_s": gen, "reward_s": reward,
                         "cpu_s": r.get("perf/cpu_s", float("nan")),
                         "resp_tokens": 16 * r.get("response_length/mean", float("nan")), "load": r.get("load")})
    return rows


def summarize(raw: dict, first: int = 2) -> dict:
    rows = [r for r in _steps(raw) if r["step"] >= first]

    def med(key: str) -> float:
        vals = [r[key] for r in rows if r[key] is not None]
        return statistics.median(vals) if vals else float("nan")

    step = med("step_s")
    return {
        "step_s": step, "gen_s": med("gen_s"), "reward_s": med("reward_s"),
        "train_s": statistics.median([r["step_s"] - r["gen_s"] - r["reward_s"] for r in rows]),
        "resp_tokens_per_s": statistics.median([r["resp_tokens"] / r["step_s"] for r in rows]),
        "resp_len_mean": med("resp_tokens") / 16, "cpu_s": med("cpu_s"),
        "peak_rss_mb": raw.get("peak_rss_mb"), "steps_used": len(rows),
    }


def table(summary: dict[str, dict]) -> str:
    head = (f"{'variant':18s} {'step s':>8s} {'gen s':>7s} {'reward s':>8s} {'train s':>8s} {'resp tok/s':>10s} "
            f"{'resp len':>8s} {'CPU s':>7s} {'peak RSS MB':>11s} {'rlkit/TRL':>9s} {'CPU ratio':>9s}")
    lines = [head, "-" * len(head)]
    for name, s in summary.items():
        ref = summary.get("trl-kl" if name.endswith("-kl") else "trl")  # TRL without gradient checkpointing
        ratio = s["step_s"] / ref["step_s"] if ref and name.startswith("rlkit") else None
        cpu_ratio = s["cpu_s"] / ref["cpu_s"] if ref and name.startswith("rlkit") else None
        if name == "trl-defaults" and "rlkit-vllm" in summary:  # rlkit's default against TRL's default
            ratio = summary["rlkit-vllm"]["step_s"] / s["step_s"]
            cpu_ratio = summary["rlkit-vllm"]["cpu_s"] / s["cpu_s"]
        lines.append(
            f"{name:18s} {s['step_s']:8.1f} {s['gen_s']:7.1f} {s['reward_s']:8.2f} {s['train_s']:8.1f} "
            f"{s['resp_tokens_per_s']:10.1f} {s['resp_len_mean']:8.1f} {s['cpu_s']:7.1f} {s['peak_rss_mb']:11.0f} "
            f"{(f'{ratio:.2f}x' if ratio else '-'):>9s} {(f'{cpu_ratio:.2f}x' if cpu_ratio else '-'):>9s}"
        )
    return "\n".join(lines)


def combine_rounds(per_round: list[dict[str, dict]]) -> dict[str, dict]:
    """Median of each number over rounds (each round is already a median over steps 2-5)."""
    out: dict[str, dict] = {}
    names = list(dict.fromkeys(n for r in per_round for n in r))
    for name in names:
        runs = [r[name] for r in per_round if name in r]
        out[name] = {k: statistics.median([run[k] for run in runs if run[k] is not None] or [float("nan")])
                     for k in runs[0]}
        out[name]["rounds"] = len(runs)
    return out


def alternate(bench: str, variants: list[str], rounds: int, run: Callable[[str, Path], dict],
              summarize_run: Callable[[dict], dict], result: dict, out: Path) -> None:
    """The side-by-side benches' loop (sft_vs_trl, dpo_vs_trl): every round runs each variant once in the same
    order, so a busy spell of the shared machine hits them all; `run(name, out_dir)` returns a run's raw record,
    its summary is appended to result["runs"][name] in place, and the JSON is rewritten after each run (a
    stopped bench keeps what finished)."""
    for rnd in range(rounds):
        for name in variants:
            out_dir = DATA_CACHE / "runs" / bench / f"{name}-{rnd}"
            out_dir.mkdir(parents=True, exist_ok=True)
            print(f"{bench}: {name} round {rnd + 1} (load {os.getloadavg()[0]:.1f})", flush=True)
            result["runs"][name].append(summarize_run(run(name, out_dir)))
            result["meta"]["load_avg_end"] = os.getloadavg()
            result["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write_text(json.dumps(result, indent=1))


def print_report(path: str | Path, table_of: Callable[[dict], str]) -> None:
    """`--report FILE`: a saved run's meta line and table, nothing re-run."""
    saved = json.loads(Path(path).read_text())
    print(saved["meta"])
    print(table_of(saved))


def trl_best_precision(threads: int = 2) -> str:
    """bf16 (TRL's `bf16=True` autocast) where this CPU's bf16 matmul is measurably faster, else fp32: the same
    measurement that makes rlkit's `param_dtype: auto` choose, ignoring an override of rlkit's own choice."""
    from rlkit.utils.cpu_precision import measured_rates

    return "bf16" if measured_rates(threads).dtype == "bfloat16" else "fp32"


def precision_meta(threads: int = 2) -> dict:
    """The ISA and the dtypes each side computes in (the table prints them): TRL at its best precision on this
    CPU (fp32 weights; bf16 autocast where bf16 is faster); rlkit's actor `param_dtype: auto`, its engine
    `rollout.dtype`."""
    from rlkit.config.rollout import RolloutConfig
    from rlkit.rollout.base import engine_dtype
    from rlkit.utils.cpu_precision import auto_cpu_dtype, plan_row, read_isa

    engine = f"{RolloutConfig.dtype} -> {engine_dtype(RolloutConfig.dtype, on_gpu=False)}"
    trl = "bf16 autocast (bf16=True)" if trl_best_precision(threads) == "bf16" else "float32"
    return {"isa": read_isa().describe(), "trl_dtype": f"{trl} on trl/trl-kl/trl-defaults",
            "rlkit_actor_dtype": plan_row("auto", "cpu", threads=threads), "rlkit_engine_dtype": engine,
            "actor_dtype": str(auto_cpu_dtype()).removeprefix("torch."),
            "engine_dtype": engine_dtype(RolloutConfig.dtype, on_gpu=False)}


def precision_lines(meta: dict) -> str:
    if "isa" not in meta:
        return "(precision and ISA not recorded in this file)"
    return (f"ISA: {meta['isa']}\nprecision: TRL {meta['trl_dtype']}; rlkit actor {meta['rlkit_actor_dtype']}; "
            f"rlkit engine {meta['rlkit_engine_dtype']}")


def measure_peak(path: Path) -> Path:
    """bench/peak.py on this machine, now (the bounds need this CPU's peak at the load of the run)."""
    print(f"vs_trl: measuring this machine's peak -> {path}", flush=True)
    subprocess.run([sys.executable, str(ROOT / "bench" / "peak.py"), "--out", str(path)], check=True)
    return path


def print_bounds(saved: dict, peak_file: str | Path) -> None:
    """Each rlkit phase against its bound (bench/phase_bounds.py), for the variants whose metric rows were kept."""
    from phase_bounds import Peak, report_bounds
    from phase_bounds import table as bound_table

    if "model_dir" not in saved["meta"]:
        print("(no phase bounds: this file predates them)")
        return
    peak = Peak.from_file(peak_file)
    print(f"\nbounds from {peak.source}")
    for name, bounds in report_bounds(saved, peak).items():
        print(bound_table(bounds, f"{name}: each phase against this machine's bound"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated of {list(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="repeat the whole set; medians over rounds")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--report", default=None, help="only print the table of a saved JSON")
    ap.add_argument("--peak", default=None,
                    help="bench/peak.py's JSON measured on this machine, for the phase-bound table (default: run "
                         "bench/peak.py first, into the runs folder)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other variants already in --out (rerun a subset after a change)")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(precision_lines(saved["meta"]))
        print(table(saved["summary"]))
        if args.peak:
            print_bounds(saved, args.peak)
        return
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    trl_py = ensure_trl_venv() if any(VARIANTS[n][0] == "trl" for n in names) else None
    data, model = ensure_data(), model_dir(args.model)
    out = Path(args.out)
    runs_dir = DATA_CACHE / "runs" / out.stem  # raw per-run JSON + logs (large), outside the repo
    runs_dir.mkdir(parents=True, exist_ok=True)
    per_round, raw_steps, metric_rows = [], {}, {}
    precision = precision_meta()
    peak_file = args.peak or measure_peak(runs_dir / "peak.json")
    kept: dict[str, dict] = {}
    if args.merge and out.exists():
        previous = json.loads(out.read_text())
        kept = {k: {**v, "measured": previous["meta"].get("finished")}
                for k, v in previous["summary"].items() if k not in names}
        raw_steps.update({k: v for k, v in previous.get("steps", {}).items() if k in kept})

    def save() -> dict[str, dict]:
        combined = {**kept, **combine_rounds(per_round)}
        result = {
            "meta": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                     "model": args.model, "steps": args.steps, "rounds": args.rounds,
                     "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "load_avg": os.getloadavg(), **precision,
                     "model_dir": str(model), "rows": 16, "peak_file": str(peak_file)},
            "summary": combined, "per_round": per_round, "steps": raw_steps, "metrics": metric_rows,
        }
        out.write_text(json.dumps(result, indent=1))
        return combined

    for rnd in range(args.rounds):
        summary: dict[str, dict] = {}
        per_round.append(summary)
        for name in names:
            try:
                raw = run_variant(name, model, data, args.steps, runs_dir, trl_py)
            except RuntimeError as exc:  # one broken variant must not lose the others' numbers
                print(f"vs_trl: {exc}", file=sys.stderr, flush=True)
                continue
            summary[name] = summarize(raw)
            raw_steps.setdefault(name, []).append(_steps(raw))
            if raw["framework"] != "trl":
                metric_rows.setdefault(name, []).append(raw["steps"])
            print(f"vs_trl: {name} round {rnd + 1}: step {summary[name]['step_s']:.1f}s "
                  f"(gen {summary[name]['gen_s']:.1f}s, train {summary[name]['train_s']:.1f}s)", flush=True)
            save()  # partial results survive an interrupted run
    combined = save()
    print()
    print(precision_lines(precision))
    print(table(combined))
    print_bounds(json.loads(out.read_text()), peak_file)
    print(f"\nvs_trl: wrote {out} (raw per-run JSON and logs in {runs_dir})")


if __name__ == "__main__":
    main()
