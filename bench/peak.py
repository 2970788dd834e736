"""Measured peak of this machine: matmul GFLOP/s (fp32, bf16) and memory bandwidth (GB/s).

    .venv/bin/python bench/peak.py                # all cores and one core -> bench/results/peak.json
    .venv/bin/python bench/peak.py --quick        # smaller sizes, fewer repeats (tests, ~10 s)

With `RLKIT_PEAK_FILE=bench/results/peak.json` (written on this machine), `perf/mfu` divides the
model FLOPs of a step by this peak (`rlkit.utils.flops.peak_flops`): fp32 or bf16 by the actor's
compute dtype, per core times the cores the workers use; without it, by the precision probe's
rates measured on this machine. On a GPU the device's spec sheet peak is used instead.
It also records the CPU's ISA (its bf16 flags) and bf16's speed-up over fp32, the question
`param_dtype: auto` asks on CPU (rlkit/utils/cpu_precision.py, which times the same function,
`rlkit.utils.matmul_timing.matmul_gflops`, at start-up and caches the answer per machine).
Where bf16 has no fast kernel (AVX2 only) a bf16 matmul runs ~100x slower than fp32, so the
full run takes minutes there; --quick takes seconds.

Each number is the best of `--repeats` timed calls after a warm-up: a peak is what the
hardware can do, so on a shared machine the best call is the estimate (the median is
stored beside it to show the noise). Matmuls are square n x n x n (2 n^3 FLOPs);
bandwidth is a `copy_` of a large buffer (bytes read + written) and a `sum` (bytes read).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from rlkit.utils.cpu_precision import MIN_SPEEDUP, read_isa
from rlkit.utils.matmul_timing import best_and_median, matmul_gflops

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "peak.json"


def bandwidth_gbs(mb: int, repeats: int) -> dict:
    numel = mb * 2**20 // 4
    src = torch.rand(numel)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4
    copy_best, copy_med = best_and_median(lambda: dst.copy_(src), repeats)
    read_best, read_med = best_and_median(lambda: src.sum(), repeats)
    return {
        "buffer_mb": mb,
        "copy_gbs": 2 * nbytes / copy_best / 1e9,
        "copy_gbs_median": 2 * nbytes / copy_med / 1e9,
        "read_gbs": nbytes / read_best / 1e9,
        "read_gbs_median": nbytes / read_med / 1e9,
    }


def measure(threads: int, sizes: list[int], repeats: int, buffer_mb: int) -> dict:
    torch.set_num_threads(threads)
    out: dict = {"threads": threads}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rows = [matmul_gflops(n, dtype, repeats) for n in sizes]
        best = max(rows, key=lambda r: r["gflops"])
        out[f"{name}_gflops"] = best["gflops"]
        out[f"{name}_rows"] = rows
        print(
            f"  {threads} thread(s) {name}: " + ", ".join(f"n={r['n']} {r['gflops']:.1f}" for r in rows) + " GFLOP/s",
            flush=True,
        )
    out["bandwidth"] = bandwidth_gbs(buffer_mb, repeats)
    bw = out["bandwidth"]
    print(f"  {threads} thread(s) memory: copy {bw['copy_gbs']:.1f} GB/s, read {bw['read_gbs']:.1f} GB/s", flush=True)
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--sizes", default=None, help="matmul sizes, e.g. 512,1024 (where bf16 is emulated, 2048 "
                    "takes minutes per call)")
    args = ap.parse_args(argv)
    sizes = [256, 512] if args.quick else [512, 1024, 2048]
    if args.sizes:
        sizes = [int(n) for n in args.sizes.split(",")]
    repeats = args.repeats or (3 if args.quick else 7)
    buffer_mb = 64 if args.quick else 512
    cores = os.cpu_count() or 1
    isa = read_isa()
    print(f"peak: {isa.describe()}, {cores} cores, torch {torch.__version__}", flush=True)
    all_cores = measure(cores, sizes, repeats, buffer_mb)
    one_core = measure(1, sizes, repeats, buffer_mb) if cores > 1 else all_cores
    result = {
        "cpu": cpu_name(),
        "cores": cores,
        "isa": isa.describe(),
        "torch": torch.__version__,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_avg_1m": os.getloadavg()[0],
        "fp32_gflops": all_cores["fp32_gflops"],
        "bf16_gflops": all_cores["bf16_gflops"],
        "bf16_speedup": all_cores["bf16_gflops"] / all_cores["fp32_gflops"],
        "fp32_gflops_per_core": one_core["fp32_gflops"],
        "bf16_gflops_per_core": one_core["bf16_gflops"],
        "copy_gbs": all_cores["bandwidth"]["copy_gbs"],
        "read_gbs": all_cores["bandwidth"]["read_gbs"],
        "all_cores": all_cores,
        "one_core": one_core,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(
        f"peak: fp32 {result['fp32_gflops']:.1f} GFLOP/s ({result['fp32_gflops_per_core']:.1f}/core), "
        f"bf16 {result['bf16_gflops']:.1f} GFLOP/s ({result['bf16_gflops_per_core']:.1f}/core), "
        f"copy {result['copy_gbs']:.1f} GB/s -> {out}"
    )
    verdict = "faster: param_dtype=auto trains in bf16" if result["bf16_speedup"] >= MIN_SPEEDUP else "not faster"
    print(
        f"peak: bf16 {result['bf16_speedup']:.2f}x fp32 ({verdict}; rlkit/utils/cpu_precision.py decides at "
        f"start-up with its own cached measurement at the workers' thread count)"
    )
    return result


if __name__ == "__main__":
    main()
