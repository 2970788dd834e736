"""bf16 vs fp32 compute on this CPU: matmul GFLOP/s and one actor update step (forward + backward + AdamW).

    .venv/bin/python bench/precision.py                      # -> bench/results/precision.json
    .venv/bin/python bench/precision.py --layers 30 --rows 8 # the full SmolLM2-135M depth (slow where bf16 is emulated)

What `param_dtype: auto` decides on CPU (rlkit/utils/cpu_precision.py) checked end to end: the update step of
a random model with SmolLM2-135M's shape (hidden 576, 9 heads / 3 KV heads, MLP 1536, vocab 49152, tied
head; `--layers` of its 30, fewer by default so the emulated-bf16 case finishes in about a minute) through
`FSDPModel` (bf16: FSDP2 mixed precision, fp32 master weights and Adam state; fp32: the plain module, as
`auto` would run it). Each step time is the best of `--repeats` after a warm-up step. The matmul numbers are
`rlkit.utils.matmul_timing.matmul_gflops` at the precision probe's shape. Prints the ISA and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from long_context import save_model  # noqa: E402  (the SmolLM2-135M-shaped random model, one definition)

DEFAULT_OUT = ROOT / "bench" / "results" / "precision.json"


def update_step_seconds(model_dir: Path, dtype: str, rows: int, prompt: int, response: int, repeats: int) -> dict:
    """Best and all times of one forward + backward + optimizer step, and the step's loss (same batch each time)."""
    from rlkit.config.schema import FSDPConfig, OptimConfig
    from rlkit.workers.fsdp_model import FSDPModel

    model = FSDPModel(str(model_dir), FSDPConfig(param_dtype=dtype), torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=1e-6), total_steps=repeats + 1)
    model.module.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 49152, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    pos = mask.cumsum(1) - 1
    times, losses = [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        loss = -model.forward(ids, mask, pos, response).log_probs.mean()
        loss.backward()
        model.clip_and_step(1.0)
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach()))
    return {"dtype": dtype, "best_s": min(times[1:]), "times_s": times, "first_loss": losses[0]}


def main(argv: list[str] | None = None) -> dict:
    from rlkit.utils.cpu_precision import MIN_SPEEDUP, PROBE, SIZE, TOKENS, read_isa
    from rlkit.utils.matmul_timing import matmul_gflops

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--response", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torch.distributed as dist

    isa = read_isa()
    load_before = os.getloadavg()[0]
    print(f"precision: {isa.describe()}, {args.threads} thread(s), load {load_before:.2f}", flush=True)
    matmul = {}
    for name, n, m in (("probe", PROBE, PROBE), ("model", SIZE, TOKENS)):
        fp32 = bf16 = 0.0
        for _ in range(2):  # interleaved rounds, the best of each (as rlkit.utils.cpu_precision.measure)
            fp32 = max(fp32, matmul_gflops(n, torch.float32, 3, m=m)["gflops"])
            bf16 = max(bf16, matmul_gflops(n, torch.bfloat16, 1 if name == "model" else 3, m=m)["gflops"])
        matmul[name] = {"m": m, "n": n, "k": n, "fp32_gflops": fp32, "bf16_gflops": bf16, "speedup": bf16 / fp32}
        print(f"  matmul {m}x{n}x{n}: fp32 {fp32:.1f}, bf16 {bf16:.1f} GFLOP/s ({bf16 / fp32:.2f}x)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(str(Path(tmp) / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)  # FSDP2 (the bf16 path) needs a group
        save_model(Path(tmp) / "model", args.layers)
        steps = {}
        for dtype in ("float32", "bfloat16"):
            steps[dtype] = update_step_seconds(
                Path(tmp) / "model", dtype, args.rows, args.prompt, args.response, args.repeats
            )
            print(
                f"  update step {dtype}: {steps[dtype]['best_s']:.2f} s (loss {steps[dtype]['first_loss']:.4f})",
                flush=True,
            )
        dist.destroy_process_group()
    speedup = steps["float32"]["best_s"] / steps["bfloat16"]["best_s"]
    result = {
        "isa": isa.describe(),
        "torch": torch.__version__,
        "threads": args.threads,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_avg_1m": [load_before, os.getloadavg()[0]],
        "model": f"SmolLM2-135M shape, {args.layers} layer(s)",
        "batch": {"rows": args.rows, "prompt": args.prompt, "response": args.response},
        "matmul": matmul,
        "update_step": steps,
        "update_speedup_bf16": speedup,
        "auto_would_pick": "bfloat16" if matmul["model"]["speedup"] >= MIN_SPEEDUP else "float32",
    }
    print(f"precision: update step bf16 {speedup:.2f}x fp32; auto picks {result['auto_would_pick']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
