"""Per-rank memory and step time of a training step at tensor parallel 1 and 2 (issue 46's benchmark table).

n gloo ranks (one OpenMP thread each) build the same model with `FSDPModel` in float32 and run training steps
(forward with log-probs and entropy, a policy-gradient loss, backward, clip, AdamW), in three layouts of the same
n workers: `tp1` (FSDP2 over all), `tp<n>` (one TP group, sequence parallel on, the default) and `tp<n>-nosp`
(sequence parallel off). n is 2 for the toy model and 3 for SmolLM2-135M, whose 9 attention and 3 key/value heads
do not split in 2. Each layout runs in fresh processes, so each peak RSS is that layout's alone. Per rank:
parameters, gradients and optimizer state actually held (the local shards' bytes), the RSS before the step (after
handing freed heap back: `malloc_trim`) and its peak during the steps (the kernel's high-water mark, reset
before the first measured step), and the median step time. Workloads: the toy model (the suite's tiny Llama)
and SmolLM2-135M (`rlkit model pull`).

    .venv/bin/python bench/tp_memory.py                    # both workloads -> bench/results/tp_memory.json
    .venv/bin/python bench/tp_memory.py --models toy --steps 3   # a quick smoke

Run it on an idle machine: the two ranks share its cores (the load average is recorded).
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

import torch

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {  # rows per rank, prompt and response tokens
    "toy": dict(rows=8, prompt=32, response=32),
    "smollm2": dict(rows=4, prompt=256, response=256),
}
WORLD = {"toy": 2, "smollm2": 3}  # workers, = the TP size compared with tp 1


def layouts(world: int) -> dict[str, tuple[int, bool]]:
    """name: (tensor_parallel_size, sequence_parallel)."""
    return {"tp1": (1, True), f"tp{world}": (world, True), f"tp{world}-nosp": (world, False)}
MB = 2**20


def batch(rows: int, prompt: int, response: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Full rows of random tokens (every rank its own), a random advantage per row."""
    g = torch.Generator().manual_seed(seed)
    width = prompt + response
    mask = torch.ones(rows, width, dtype=torch.long)
    return {
        "input_ids": torch.randint(5, vocab, (rows, width), generator=g),
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1),
        "response_mask": torch.ones(rows, response, dtype=torch.long),
        "advantages": torch.randn(rows, 1, generator=g).expand(rows, response).contiguous(),
    }


def local_mb(tensors) -> float:
    """The tensors' local bytes (a DTensor's shard) in MB: rlkit's own count (rlkit/utils/memory_peak.py)."""
    from rlkit.utils.memory_peak import GB, tensor_gb

    return tensor_gb(tensors) * GB / MB


def rank_main(rank: int, store: str, spec: dict, results) -> None:
    import torch.distributed as dist

    from rlkit.config.schema import FSDPConfig, OptimConfig
    from rlkit.utils.memory_peak import reset_rss_peak, rss_bytes, trim_heap
    from rlkit.workers.fsdp_model import FSDPModel

    torch.set_num_threads(1)
    world = WORLD[spec["workload"]]
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        tp, seq_parallel = layouts(world)[spec["layout"]]
        config = FSDPConfig(param_dtype="float32", tensor_parallel_size=tp, sequence_parallel=seq_parallel)
        model = FSDPModel(spec["path"], config, torch.device("cpu"))
        model.setup_optimizer(OptimConfig(lr=1e-5, weight_decay=0.0), total_steps=spec["steps"] + 1)
        work = WORKLOADS[spec["workload"]]
        data = batch(**work, vocab=model.module.config.vocab_size, seed=rank)
        response = work["response"]

        def step() -> float:
            start = time.perf_counter()
            model.module.zero_grad(set_to_none=True)
            out = model.forward(data["input_ids"], data["attention_mask"], data["position_ids"], response,
                                with_entropy=True)
            mask = data["response_mask"].float()
            loss = -((data["advantages"] * out.log_probs - 0.01 * out.entropy) * mask).sum() / mask.sum()
            loss.backward()
            grads = local_mb(p.grad for p in model.module.parameters())
            model.clip_and_step(1.0)
            step.grads = grads
            return time.perf_counter() - start

        step()  # warm-up: the optimizer state exists after it
        trim_heap()  # the load's and the warm-up's freed heap back to the OS: RSS is then what is held
        rss_before = rss_bytes()
        reset_rss_peak()
        times = [step() for _ in range(spec["steps"])]
        with open("/proc/self/status") as fh:
            peak_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
        report = model.memory_report()
        results.put((rank, {
            "params_mb": local_mb(model.module.parameters()),
            "grads_mb": step.grads,
            "optimizer_state_mb": report["optimizer_state_mb"],
            "rss_before_step_gb": rss_before / 2**30,
            "rss_peak_gb": peak_kb / 2**20,
            "step_peak_over_before_mb": (peak_kb * 1024 - rss_before) / MB,
            "step_s_median": statistics.median(times),
        }))
    except BaseException as exc:  # the parent reports it
        results.put((rank, {"error": f"{type(exc).__name__}: {exc}"}))
    finally:
        dist.destroy_process_group()


def run_layout(path: str, workload: str, layout: str, steps: int, tmp: Path) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = tmp / f"store-{workload}-{layout}"
    spec = dict(path=path, workload=workload, layout=layout, steps=steps)
    os.environ["OMP_NUM_THREADS"] = "1"
    world = WORLD[workload]
    procs = [ctx.Process(target=rank_main, args=(r, str(store), spec, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    errors = [r["error"] for r in got.values() if "error" in r]
    if errors:
        raise RuntimeError(f"{workload}/{layout}: {errors[0]}")
    return {"ranks": [got[r] for r in range(world)]}


def model_path(workload: str, tmp: Path) -> str:
    if workload == "toy":
        from rlkit.testing import save_tiny_model

        return str(save_tiny_model(tmp / "toy", heads=4))
    from rlkit.models.resolve import resolve_model_path

    return str(resolve_model_path("smollm2-135m-instruct"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--steps", type=int, default=5, help="measured steps per layout (after one warm-up step)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tp_memory.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    out: dict = {"load_before": os.getloadavg(), "cpu_count": os.cpu_count(), "dtype": "float32", "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="rlkit-tp-memory-") as tmp_name:
        tmp = Path(tmp_name)
        for workload in args.models:
            path = model_path(workload, tmp)
            rows = out["workloads"][workload] = {"shape": WORKLOADS[workload], "layouts": {}}
            for layout in layouts(WORLD[workload]):
                rows["layouts"][layout] = row = run_layout(path, workload, layout, args.steps, tmp)
                r0 = row["ranks"][0]
                print(f"{workload:8} {layout:9} params {r0['params_mb']:8.1f} MB  grads {r0['grads_mb']:8.1f} MB  "
                      f"adam {r0['optimizer_state_mb']:8.1f} MB  rss {r0['rss_before_step_gb']:.2f} -> peak "
                      f"{r0['rss_peak_gb']:.2f} GB (+{r0['step_peak_over_before_mb']:.0f} MB)  "
                      f"step {r0['step_s_median']:.2f} s", flush=True)
    out["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"-> {args.out} (load {out['load_before'][0]:.1f} before, {out['load_after'][0]:.1f} after)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
