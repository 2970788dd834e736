"""The longest response an actor update fits in a fixed memory budget on CPU, with and without each lever.

SmolLM2-135M's shape (random weights: memory and time do not depend on them), float32, one actor update
(forward + backward of a policy-gradient loss + an AdamW step) on a micro-batch of two samples: prompts of
256 and 128 tokens, responses of R and R/2 tokens (mixed lengths, as dynamic batching gives). Levers,
added one at a time (the first row is main before issue 19):

- padded:    rows padded to the longest (`use_remove_padding=false`), the LM head's logits kept for backward;
- +packing:  the valid tokens in one row, varlen attention (`use_remove_padding=true`, the default now);
- +fused:    `fused_lm_head=true` (log-probs from hidden states in chunks; no (tokens x vocab) logits kept);
- +ckpt:     `enable_gradient_checkpointing=true` (an existing lever, for scale);
- +sp3:      Ulysses sequence parallelism over 3 gloo workers (`ulysses_sequence_parallel_size=3`: it must
             divide the model's 9 attention heads), one sample per worker, FSDP2 over the same three: the
             peak is per worker. Three workers need three samples: the third has a 192-token prompt and an
             R/2 response, so this row carries more tokens than the others (conservative).

Each (lever, R) runs in its own process and reports its whole peak RSS (libraries, weights, gradients,
optimizer state and activations). The budget column fits peak = a + b R + c R^2 (c >= 0) through the measured
lengths and solves for the R that reaches `--budget-gib`: an extrapolation, marked as such. Time per token
is the update's wall time over the micro-batch's tokens at the longest measured R.

    .venv/bin/python bench/long_context_budget.py                          # R = 1k, 2k, 4k; 30 layers
    .venv/bin/python bench/long_context_budget.py --lengths 256,512 --layers 2 --levers padded,+fused
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
sys.path.insert(0, str(ROOT / "bench"))
LEVERS = {  # name -> FSDPModel / forward settings (cumulative, in this order)
    "padded": dict(remove_padding=False, fused=False, ckpt=False, sp=1),
    "+packing": dict(remove_padding=True, fused=False, ckpt=False, sp=1),
    "+fused": dict(remove_padding=True, fused=True, ckpt=False, sp=1),
    "+ckpt": dict(remove_padding=True, fused=True, ckpt=True, sp=1),
    "+sp3": dict(remove_padding=True, fused=True, ckpt=True, sp=3),
}
PROMPTS = (256, 128, 192)  # the third sample only under SP (one per worker)


def make_rows(response: int, rows: tuple[int, ...]):
    """Left-padded prompts of PROMPTS tokens, responses of R, R/2, R/2 tokens; `rows` picks the samples."""
    import torch

    p_max = max(PROMPTS)
    masks, responses = [], []
    for p_len, r_len in zip(PROMPTS, (response, response // 2, response // 2)):
        p_mask = (torch.arange(p_max) >= p_max - p_len).long()
        r_mask = (torch.arange(response) < r_len).long()
        masks.append(torch.cat([p_mask, r_mask]))
        responses.append(r_mask)
    mask, r_mask = torch.stack(masks)[list(rows)], torch.stack(responses)[list(rows)]
    ids = torch.randint(10, 49152, mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0), r_mask


def update_once(lever: str, response: int, model_dir: str, rows: tuple[int, ...]) -> dict:
    """One actor update in this process; returns its time, tokens and whole-process peak RSS."""
    import torch

    from rlkit.config.schema import FSDPConfig
    from rlkit.workers.fsdp_model import FSDPModel

    s = LEVERS[lever]
    model = FSDPModel(
        model_dir,
        FSDPConfig(),
        torch.device("cpu"),
        gradient_checkpointing=s["ckpt"],
        ulysses_sequence_parallel_size=s["sp"],
    )
    model.module.train()  # gradient checkpointing acts in training mode only (no dropout in these models)
    optim = torch.optim.AdamW(model.trainable_parameters(), lr=1e-6)
    ids, mask, pos, r_mask = make_rows(response, rows)
    start = time.perf_counter()
    out = model.forward(ids, mask, pos, response, remove_padding=s["remove_padding"], fused_lm_head=s["fused"])
    (-(out.log_probs * r_mask).sum() / r_mask.sum()).backward()
    optim.step()
    return {
        "seconds": time.perf_counter() - start,
        "tokens": int(mask.sum()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _sp_rank(rank: int, world: int, init: str, lever: str, response: int, model_dir: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        result = update_once(lever, response, model_dir, rows=(rank,))  # one sample per worker
        Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_one(lever: str, response: int, model_dir: str, threads: int) -> dict:
    """This process's case: one update, or (sp > 1) one per gloo worker, the slowest and largest reported."""
    import torch

    sp = LEVERS[lever]["sp"]
    if sp == 1:
        torch.set_num_threads(threads)
        return update_once(lever, response, model_dir, rows=(0, 1))
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/rendezvous"
        mp.spawn(_sp_rank, args=(sp, init, lever, response, model_dir, tmp), nprocs=sp, join=True)
        ranks = [json.loads(Path(tmp, f"{r}.json").read_text()) for r in range(sp)]
    return {
        "seconds": max(r["seconds"] for r in ranks),
        "tokens": sum(r["tokens"] for r in ranks),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
    }


def budget_length(points: list[tuple[int, float]], budget_mb: float) -> float:
    """The R where the fitted peak(R) = a + b R + c R^2 (least squares, c clipped at 0) reaches the budget."""
    import numpy as np

    r = np.array([p[0] for p in points], dtype=float)
    m = np.array([p[1] for p in points], dtype=float)
    c, b, a = np.polyfit(r, m, 2) if len(points) >= 3 else (0.0, *np.polyfit(r, m, 1))
    if c <= 0:
        b, a = np.polyfit(r, m, 1)
        return float((budget_mb - a) / b) if b > 0 else float("inf")
    return float((-b + np.sqrt(b * b - 4 * c * (a - budget_mb))) / (2 * c))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048,4096", help="response lengths R (the second sample has R/2)")
    ap.add_argument("--levers", default=",".join(LEVERS))
    ap.add_argument(
        "--lever-lengths",
        action="append",
        default=[],
        metavar="LEVER=R1,R2,...",
        help="other lengths for one lever (e.g. padded=256,512,1024: its attention is quadratic)",
    )
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2-135M has 30")
    ap.add_argument("--budget-gib", type=float, default=16.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "long_context_budget.json"))
    ap.add_argument("--one", nargs=3, metavar=("LEVER", "R", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        lever, response, model_dir = args.one
        print(json.dumps(run_one(lever, int(response), model_dir, args.threads)))
        return

    from long_context import save_model

    lengths = [int(x) for x in args.lengths.split(",")]
    levers = args.levers.split(",")
    per_lever = {lever: lengths for lever in levers}
    for item in args.lever_lengths:
        lever, _, values = item.partition("=")
        per_lever[lever] = [int(x) for x in values.split(",")]
    unknown = set(levers) - set(LEVERS)
    if unknown:
        raise SystemExit(f"unknown lever(s) {sorted(unknown)}; choose from {list(LEVERS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(Path(tmp) / "model")
        save_model(Path(model_dir), args.layers)
        for lever in levers:
            for response in per_lever[lever]:
                cmd = [
                    sys.executable,
                    __file__,
                    "--one",
                    lever,
                    str(response),
                    model_dir,
                    "--threads",
                    str(args.threads),
                ]
                res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                if res.returncode != 0:
                    raise SystemExit(f"{lever} R={response} failed:\n{res.stderr[-3000:]}")
                row = {"lever": lever, "response": response, **json.loads(res.stdout.strip().splitlines()[-1])}
                rows.append(row)
                print(
                    f"{lever:9} R={response:6d} tokens={row['tokens']:6d} {row['seconds']:8.1f} s "
                    f"peak {row['peak_rss_mb']:8.0f} MiB",
                    flush=True,
                )
    budget_mb = args.budget_gib * 1024
    table = []
    print(f"\n{'lever':9} {'peak MiB at response length R':>44} {'max R in budget':>16} {'ms/token':>9}")
    for lever in levers:
        mine = [r for r in rows if r["lever"] == lever]
        longest = max(mine, key=lambda r: r["response"])
        entry = {
            "lever": lever,
            "peak_rss_mb": {r["response"]: r["peak_rss_mb"] for r in mine},
            "max_response_in_budget_extrapolated": budget_length(
                [(r["response"], r["peak_rss_mb"]) for r in mine], budget_mb
            ),
            "ms_per_token": 1000 * longest["seconds"] / longest["tokens"],
        }
        table.append(entry)
        peaks = ", ".join(f"{r['response']}: {r['peak_rss_mb']:.0f}" for r in mine)
        longest_r = entry["max_response_in_budget_extrapolated"]
        print(f"{lever:9} {peaks:>44} {longest_r:16.0f} {entry['ms_per_token']:9.2f}")
    record = {
        "workload": {
            "layers": args.layers,
            "lengths": per_lever,
            "prompts": PROMPTS,
            "threads": args.threads,
            "budget_gib": args.budget_gib,
        },
        "load_average": os.getloadavg(),
        "runs": rows,
        "table": table,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out} (load average {record['load_average'][0]:.1f})")


if __name__ == "__main__":
    main()
