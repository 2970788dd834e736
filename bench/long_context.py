"""Packed micro-batches: varlen attention vs the dense block-diagonal mask vs padded rows, forward + backward.

A random model with SmolLM2-135M's shape (hidden 576, 9 heads, 3 key/value heads, MLP 1536, vocab 49152;
`--layers` of its 30, default 4 to stay short on a shared CPU) in float32 runs `FSDPModel.forward` and
backward of a policy-gradient loss on a micro-batch of `rows` sequences: left-padded prompts of
P/2..P tokens, responses of R/4..R tokens (a seeded block of 4 repeated). Variants:

- padded: `use_remove_padding=false` (rows padded, shared left padding trimmed);
- packed-varlen: `use_remove_padding=true`, sequence bounds as cumulative lengths (rlkit/workers/varlen_attention.py);
- packed-mask: the same packing with the (T x T) block-diagonal mask (the fallback for models the varlen
  function cannot serve; forced here).

Each (variant, rows) runs in its own process, so its peak RSS is its own: reported as the peak minus the RSS
just before the timed call. The linearity column compares `rows` with `2 * rows` (same length distribution).

    .venv/bin/python bench/long_context.py                          # rows 8,16; P=256, R=512; 4 layers
    .venv/bin/python bench/long_context.py --rows 4,8 --layers 2 --variants packed-varlen,padded
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VARIANTS = ("padded", "packed-varlen", "packed-mask")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def save_model(path: Path, layers: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)


def make_batch(rows: int, prompt: int, response: int, seed: int = 0):
    """`rows` sequences: a fixed block of 4 (prompts P/2..P, responses R/4..R tokens) repeated, so twice the rows is
    exactly twice the tokens in sequences of the same lengths."""
    import torch

    g = torch.Generator().manual_seed(seed)
    block = 4
    p_len = torch.randint(prompt // 2, prompt + 1, (block,), generator=g).repeat(-(-rows // block))[:rows]
    r_len = torch.randint(response // 4, response + 1, (block,), generator=g).repeat(-(-rows // block))[:rows]
    p_mask = (torch.arange(prompt)[None, :] >= (prompt - p_len)[:, None]).long()
    r_mask = (torch.arange(response)[None, :] < r_len[:, None]).long()
    mask = torch.cat([p_mask, r_mask], 1)
    ids = torch.randint(10, 49152, (rows, prompt + response), generator=g) * mask
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0), r_mask


def measure_one(
    variant: str, rows: int, prompt: int, response: int, model_dir: str, threads: int, fused_head: bool
) -> dict:
    import torch

    from rlkit.config.schema import FSDPConfig
    from rlkit.workers.fsdp_model import FSDPModel

    torch.set_num_threads(threads)
    model = FSDPModel(model_dir, FSDPConfig(), torch.device("cpu"))
    if variant == "packed-mask":  # the fallback path, forced: plain sdpa fed the dense block-diagonal mask
        model.module.config._attn_implementation = "sdpa"
        model.varlen_reason = "forced by the benchmark"
    ids, mask, pos, r_mask = make_batch(rows, prompt, response)
    from rlkit.utils.memory_peak import PhasePeaks

    phases = PhasePeaks()  # the forward's and the backward's own peaks (the step summary's per-phase report)
    start_rss = rss_bytes()
    t0 = time.perf_counter()
    with phases.measure("forward"):
        out = model.forward(ids, mask, pos, response, remove_padding=variant != "padded", fused_lm_head=fused_head)
    t1 = time.perf_counter()
    with phases.measure("backward"):
        (-(out.log_probs * r_mask).sum() / r_mask.sum()).backward()
    t2 = time.perf_counter()
    peaks = {phase: row.get("rss_peak_gb", 0.0) * 2**30 for phase, row in phases.pop().items()}
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, *peaks.values())
    return {
        "variant": variant,
        "rows": rows,
        "tokens": int(mask.sum()),
        "forward_s": t1 - t0,
        "backward_s": t2 - t1,
        "total_s": t2 - t0,
        "peak_rss_above_start_mb": max(0, peak - start_rss) / 2**20,
        "forward_peak_above_start_mb": max(0, peaks.get("forward", 0) - start_rss) / 2**20,
        "backward_peak_above_start_mb": max(0, peaks.get("backward", 0) - start_rss) / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="8,16", help="micro-batch sizes; each is also run at twice its size")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--response", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fused-head", action="store_true", help="fused_lm_head=true (the head's logits not kept)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "long_context.json"))
    ap.add_argument("--one", nargs=3, metavar=("VARIANT", "ROWS", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        variant, rows, model_dir = args.one
        print(
            json.dumps(
                measure_one(variant, int(rows), args.prompt, args.response, model_dir, args.threads, args.fused_head)
            )
        )
        return

    load_before = os.getloadavg()
    sizes = sorted({n for r in args.rows.split(",") for n in (int(r), 2 * int(r))})
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        save_model(Path(tmp), args.layers)
        for variant in args.variants.split(","):
            for rows in sizes:
                cmd = [
                    sys.executable,
                    __file__,
                    "--one",
                    variant,
                    str(rows),
                    tmp,
                    "--prompt",
                    str(args.prompt),
                    "--response",
                    str(args.response),
                    "--threads",
                    str(args.threads),
                    *(["--fused-head"] if args.fused_head else []),
                ]
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if res.returncode:
                    print(f"{variant} rows={rows}: failed\n{res.stderr[-2000:]}", flush=True)
                    continue
                results.append(json.loads(res.stdout.strip().splitlines()[-1]))
                r = results[-1]
                print(
                    f"{variant:13s} rows={rows:3d} T={r['tokens']:6d}  fwd {r['forward_s']:6.2f}s  "
                    f"bwd {r['backward_s']:6.2f}s  peak +{r['peak_rss_above_start_mb']:8.1f} MiB "
                    f"(fwd +{r['forward_peak_above_start_mb']:.1f}, bwd +{r['backward_peak_above_start_mb']:.1f})",
                    flush=True,
                )
    by = {(r["variant"], r["rows"]): r for r in results}
    print(
        f"\n{'variant':13s} {'rows':>4s} {'tokens':>6s} | {'total s':>8s} {'peak MiB':>9s} {'fwd MiB':>8s} "
        f"{'bwd MiB':>8s} | "
        f"{'x2 rows: time':>13s} {'memory':>7s}"
    )
    for r in results:
        twice = by.get((r["variant"], 2 * r["rows"]))
        growth = (
            f"{twice['total_s'] / r['total_s']:12.2f}x "
            f"{twice['peak_rss_above_start_mb'] / max(r['peak_rss_above_start_mb'], 1e-9):6.2f}x"
            if twice
            else ""
        )
        print(
            f"{r['variant']:13s} {r['rows']:4d} {r['tokens']:6d} | {r['total_s']:8.2f} "
            f"{r['peak_rss_above_start_mb']:9.1f} {r['forward_peak_above_start_mb']:8.1f} "
            f"{r['backward_peak_above_start_mb']:8.1f} | {growth}"
        )
    out = {
        "model": "SmolLM2-135M shape, random init",
        "layers": args.layers,
        "prompt": args.prompt,
        "response": args.response,
        "threads": args.threads,
        "fused_head": args.fused_head,
        "dtype": "float32",
        "device": "cpu",
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rows": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
