"""Naive vs fused chunked LM-head log-prob: peak memory and time of forward + backward on CPU.

The head of SmolLM2-135M (H=576, V=49152, float32) on T response tokens. Naive: the head's logits
(T x V), then `logprobs_from_logits` / `entropy_from_logits` (rlkit/algo/utils.py) and autograd;
fused: `fused_lm_head_logprob` (rlkit/workers/fused_lm_head.py). Both chunk rows by 1024 and get
gradients for the hidden states and the head weight. Each (variant, T, mode) runs in its own process,
so its peak RSS is its own: reported as the peak minus the RSS just before the timed call (inputs and
weights already allocated), next to the bytes autograd saved for backward.

    .venv/bin/python bench/lm_head.py                       # T = 1k, 4k, 8k, log-probs only
    .venv/bin/python bench/lm_head.py --modes logp,logp+entropy --tokens 1024,4096
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_one(variant: str, tokens: int, mode: str, hidden: int, vocab: int, chunk: int, threads: int) -> dict:
    """One forward + backward in this process: time, peak RSS above the start, bytes saved for backward."""
    import torch

    from rlkit.algo.utils import entropy_from_logits, logprobs_from_logits
    from rlkit.workers.fused_lm_head import fused_lm_head_logprob

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g).requires_grad_()
    w = (0.02 * torch.randn(vocab, hidden, generator=g)).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    with_entropy = mode == "logp+entropy"

    def run():
        if variant == "fused":
            lp, ent, _ = fused_lm_head_logprob(h, w, None, labels, 1.0, chunk, with_entropy)
        else:
            logits = torch.nn.functional.linear(h, w)
            lp = logprobs_from_logits(logits, labels, chunk_size=chunk)
            ent = entropy_from_logits(logits, chunk_size=chunk) if with_entropy else None
        return lp.sum() + (0.01 * ent.sum() if ent is not None else 0.0)

    saved: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        saved[s.data_ptr()] = s.nbytes()
        return t

    start_rss = rss_bytes()
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {
        "variant": variant,
        "tokens": tokens,
        "mode": mode,
        "forward_s": t1 - t0,
        "backward_s": t2 - t1,
        "total_s": t2 - t0,
        "peak_rss_above_start_mb": max(0, peak - start_rss) / 2**20,
        "saved_for_backward_mb": sum(saved.values()) / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="1024,4096,8192")
    ap.add_argument("--modes", default="logp", help="comma list of logp, logp+entropy")
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--chunk", type=int, default=1024, help="rows per chunk (actor.logits_chunk_size)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lm_head.json"))
    ap.add_argument("--one", nargs=3, metavar=("VARIANT", "T", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        variant, tokens, mode = args.one
        print(json.dumps(measure_one(variant, int(tokens), mode, args.hidden, args.vocab, args.chunk, args.threads)))
        return

    load_before = os.getloadavg()
    rows = []
    for mode in args.modes.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            for variant in ("naive", "fused"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--one",
                    variant,
                    str(tokens),
                    mode,
                    "--hidden",
                    str(args.hidden),
                    "--vocab",
                    str(args.vocab),
                    "--chunk",
                    str(args.chunk),
                    "--threads",
                    str(args.threads),
                ]
                env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
                res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(
                    f"{mode:13s} T={tokens:6d} {variant:5s}  fwd {r['forward_s']:6.2f}s  bwd {r['backward_s']:6.2f}s"
                    f"  peak +{r['peak_rss_above_start_mb']:8.1f} MiB  saved {r['saved_for_backward_mb']:8.1f} MiB",
                    flush=True,
                )
    print(
        f"\n{'mode':13s} {'T':>6s} | {'naive s':>8s} {'fused s':>8s} | {'naive MiB':>10s} {'fused MiB':>10s} "
        f"{'mem ratio':>9s}"
    )
    for naive, fused in zip(rows[::2], rows[1::2], strict=True):
        ratio = naive["peak_rss_above_start_mb"] / max(fused["peak_rss_above_start_mb"], 1e-9)
        print(
            f"{naive['mode']:13s} {naive['tokens']:6d} | {naive['total_s']:8.2f} {fused['total_s']:8.2f} | "
            f"{naive['peak_rss_above_start_mb']:10.1f} {fused['peak_rss_above_start_mb']:10.1f} {ratio:8.1f}x"
        )
    result = {
        "hidden": args.hidden,
        "vocab": args.vocab,
        "chunk": args.chunk,
        "threads": args.threads,
        "dtype": "float32",
        "device": "cpu",
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
