"""Does an in-process vLLM engine slow the actor's forward+backward? (issue 20, lever 3)

    .venv/bin/python bench/colocation.py            # -> table + bench/results/colocation.json

One process, as in the colocated trainer: SmolLM2-135M-Instruct (fp32) runs a training forward+backward
(4 rows x 384 tokens, logits for the last 129 positions) `--repeats` times before any engine exists,
then after an rlkit vLLM engine (`VLLMRollout`) is created, then after each of `--cycles` generate
(16 x 128 tokens) + sleep rounds, as a step does. The torch profiler's per-op self CPU time of one
forward+backward before and after shows which kernels change; the process state before and after
(torch threads, CPU affinity, NUMA memory policy, OpenMP runtimes mapped, environment variables the
engine set) shows what vLLM changed. Run it on an idle machine.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "colocation.json"
MPOL = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local"}


def process_state() -> dict:
    """What an engine could change that matters to torch kernels in the same process."""
    import psutil
    import torch

    libs = sorted({os.path.basename(line.split()[-1]) for line in open("/proc/self/maps")
                   if any(k in line for k in ("omp", "jemalloc", "tcmalloc", "dnnl", "mkl"))})
    mode, mask = ctypes.c_int(-1), ctypes.c_ulong(0)
    rc = ctypes.CDLL("libc.so.6", use_errno=True).syscall(239, ctypes.byref(mode), ctypes.byref(mask), 64, None, 0)
    return {"torch_threads": torch.get_num_threads(), "affinity": sorted(os.sched_getaffinity(0)),
            "threads_in_process": psutil.Process().num_threads(), "openmp_and_allocator_libs": libs,
            "numa_policy": MPOL.get(mode.value, mode.value) if rc == 0 else "unknown", "numa_nodes_mask": mask.value,
            "rss_mb": psutil.Process().memory_info().rss / 2**20}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from rlkit.config.rollout import RolloutConfig
    from rlkit.models.resolve import resolve_model_path
    from rlkit.utils.cpu_precision import read_isa

    path = str(resolve_model_path(args.model))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
    ids = torch.randint(0, model.config.vocab_size, (4, 384))

    def fwd_bwd() -> float:
        start = time.perf_counter()
        model(input_ids=ids, logits_to_keep=129).logits.logsumexp(-1).mean().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    def ops() -> dict[str, float]:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fwd_bwd()
        return {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}

    env0 = dict(os.environ)
    fwd_bwd()  # warm-up
    rows = {"alone": [fwd_bwd() for _ in range(args.repeats)]}
    state = {"before": process_state()}
    ops_before = ops()

    from vllm import SamplingParams, TokensPrompt

    from rlkit.rollout.vllm_rollout import VLLMRollout

    engine = VLLMRollout(path, RolloutConfig(name="vllm", prompt_length=256, response_length=128, batch_rows=16))
    state["after_engine"] = process_state()
    rows["engine created"] = [fwd_bwd() for _ in range(args.repeats)]
    ops_after = ops()
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(0, 49000, (100,)).tolist()) for _ in range(16)]
    sampling = SamplingParams(max_tokens=128, temperature=1.0, ignore_eos=True)
    gen_s = []
    for c in range(args.cycles):
        start = time.perf_counter()
        engine.llm.generate(prompts, sampling, use_tqdm=False)
        gen_s.append(time.perf_counter() - start)
        engine.sleep()
        rows[f"after generate + sleep {c + 1}"] = [fwd_bwd()]
        engine.wake_up()
    state["after_generate"] = process_state()
    env_set = {k: v for k, v in os.environ.items() if env0.get(k) != v}

    base = statistics.median(rows["alone"])
    print(f"colocation: {read_isa().describe()}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    print(f"{'forward+backward (4 x 384)':32s} {'median s':>9s} {'vs alone':>9s}")
    for name, times in rows.items():
        print(f"{name:32s} {statistics.median(times):9.2f} {statistics.median(times) / base:8.2f}x")
    print(f"generation 16 x 128 tokens: {statistics.median(gen_s):.1f} s")
    top = sorted(ops_before, key=lambda k: -ops_before[k])[:8]
    print(f"\n{'op (self CPU s, one fwd+bwd)':58s} {'alone':>7s} {'engine':>7s}")
    for k in top:
        print(f"{k[:58]:58s} {ops_before[k]:7.2f} {ops_after.get(k, 0.0):7.2f}")
    print(f"{'all ops':58s} {sum(ops_before.values()):7.2f} {sum(ops_after.values()):7.2f}")
    for key in ("torch_threads", "affinity", "threads_in_process", "openmp_and_allocator_libs", "numa_policy"):
        print(f"{key}: {state['before'][key]} -> {state['after_engine'][key]}")
    print("environment set by the engine:", sorted(env_set))
    Path(args.out).write_text(json.dumps({
        "isa": read_isa().describe(), "load_avg": os.getloadavg(), "fwd_bwd_s": rows, "gen_s": gen_s,
        "ops_alone_s": ops_before, "ops_engine_s": ops_after, "state": state, "env_set_by_engine": env_set,
    }, indent=1, default=str))
    print(f"colocation: wrote {args.out}")
    engine.close()


if __name__ == "__main__":
    main()
