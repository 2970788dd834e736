"""Fixed micro-batches vs token-budget micro-batches (use_dynamic_bsz) in the actor's log-prob pass and update.

A random Llama (`--layers` 2, hidden 256, MLP 704, 4 heads, vocab 8192, tied; ~3M parameters, float32) as
`ActorWorker` on a 1-rank gloo group: `compute_log_prob` (the old-log-prob pass), then `update_actor` (one
optimizer step over all rows), on one batch shaped like real rollouts: `--rows` left-padded prompts of
P/4..P tokens and responses with a long-tailed length distribution (log-normal around `--median-response`
tokens, cut at R), so a few rows are many times longer than most.

Splits, each at the same worst case of tokens in one forward (`--budget`, default twice the longest row):
- fixed: `ppo_micro_batch_size_per_gpu` = budget // longest row (the most rows that always fit);
- dynamic: `use_dynamic_bsz` with `ppo_max_token_len_per_gpu` = budget (and the same for the log-prob pass).
Each layout runs in its own process: `use_remove_padding` on (packed rows: the valid tokens only) and off
(padded rows: shared left padding trimmed, every response padded to R). In it both splits are timed
alternately, `--repeats` times (fastest counts), so a change in the machine's load hits both alike.
Reported: forward calls of each pass, the wall time of each, the most valid tokens and the most positions
(what the forward computes and holds activations for: a memory proxy) in one forward, and the padding
fraction (positions that hold no token).

    nice -n 19 .venv/bin/python bench/dynamic_bsz.py                 # 48 rows, P=128, R=768
    nice -n 19 .venv/bin/python bench/dynamic_bsz.py --rows 32 --repeats 5 --layouts packed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LAYOUTS = ("packed", "padded")


def save_model(path: Path, layers: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                         tie_word_embeddings=True, torch_dtype="float32")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)


def lengths(rows: int, prompt: int, response: int, median_response: int, seed: int):
    """Prompt lengths uniform in P/4..P; response lengths log-normal (sigma 1) around the median, in 1..R."""
    import torch

    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(prompt // 4, prompt + 1, (rows,), generator=g)
    r_len = (median_response * torch.exp(torch.randn(rows, generator=g))).round().long().clamp(1, response)
    return p_len, r_len


def make_batch(rows: int, prompt: int, response: int, median_response: int, seed: int):
    import torch

    from rlkit.protocol import Batch

    p_len, r_len = lengths(rows, prompt, response, median_response, seed)
    g = torch.Generator().manual_seed(seed + 1)
    p_mask = (torch.arange(prompt)[None, :] >= (prompt - p_len)[:, None]).long()
    r_mask = (torch.arange(response)[None, :] < r_len[:, None]).long()
    mask = torch.cat([p_mask, r_mask], 1)
    ids = torch.randint(10, 8192, (rows, prompt + response), generator=g) * mask
    adv = torch.randn(rows, 1, generator=g).expand(rows, response) * r_mask
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                  "responses": ids[:, prompt:], "response_mask": r_mask, "advantages": adv.float().contiguous()})


def make_actor(model_dir: str, layout: str, micro, rows: int):
    from rlkit.config.schema import ActorConfig, ModelConfig, OptimConfig
    from rlkit.workers.actor import ActorWorker

    cfg = ActorConfig(ppo_mini_batch_size=rows, ppo_micro_batch_size_per_gpu=micro.rows,
                      use_dynamic_bsz=micro.use_dynamic_bsz, ppo_max_token_len_per_gpu=micro.max_token_len,
                      clip_ratio_low=0.2, clip_ratio_high=0.2, optim=OptimConfig(lr=1e-5))
    model = ModelConfig(path=model_dir, use_remove_padding=layout == "packed")
    actor = ActorWorker(cfg, model, total_steps=1, rollout_n=1, temperature=1.0, seed=0, log_prob=micro)
    actor.init_model()
    return actor


def measure_layout(layout: str, args: argparse.Namespace, model_dir: str) -> list[dict]:
    """Both splits in one process, timed alternately (fixed, dynamic, fixed, ...) so a change in the machine's
    load hits both alike; forward counts and sizes from the first repeat."""
    import torch
    import torch.distributed as dist

    from rlkit.workers.micro_batch import MicroBatching
    from rlkit.workers.packing import left_padding_start

    torch.set_num_threads(args.threads)
    store = dist.FileStore(tempfile.mktemp(prefix="rlkit-bench-pg-"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    batch = make_batch(args.rows, args.prompt, args.response, args.median_response, args.seed)
    longest = int(batch["attention_mask"].sum(-1).max())
    budget = args.budget or 2 * longest
    splits = {"fixed": MicroBatching(max(1, budget // longest), max_token_len=budget),
              "dynamic": MicroBatching(max(1, budget // longest), use_dynamic_bsz=True, max_token_len=budget)}
    actors = {name: make_actor(model_dir, layout, micro, args.rows) for name, micro in splits.items()}
    calls: dict[str, list[dict]] = {name: [] for name in splits}
    for name, actor in actors.items():
        forward = actor.model.forward

        def counted(inputs, *a, forward=forward, seen=calls[name], **kw):
            mask = inputs.attention_mask
            width = mask.shape[1] - left_padding_start(mask, kw["response_length"])  # what a padded forward keeps
            tokens = int(mask.sum())
            seen.append({"tokens": tokens, "positions": tokens if layout == "packed" else int(mask.shape[0] * width)})
            return forward(inputs, *a, **kw)

        actor.model.forward = counted
    times: dict[str, dict[str, list[float]]] = {name: {"log_prob": [], "update": []} for name in splits}
    stats: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, actor in actors.items():
            calls[name].clear()
            t0 = time.perf_counter()
            old = actor.compute_log_prob(batch)
            times[name]["log_prob"].append(time.perf_counter() - t0)
            log_prob_calls = len(calls[name])
            calls[name].clear()
            t0 = time.perf_counter()
            actor.update_actor(batch.select(list(batch.keys())).union(old.select(["old_log_probs"])))
            times[name]["update"].append(time.perf_counter() - t0)
            if name not in stats:
                update = calls[name]
                valid, positions = sum(c["tokens"] for c in update), sum(c["positions"] for c in update)
                stats[name] = {"log_prob_forwards": log_prob_calls, "update_forwards": len(update),
                               "max_tokens_per_forward": max(c["tokens"] for c in update),
                               "max_positions_per_forward": max(c["positions"] for c in update),
                               "valid_tokens": valid, "padding_frac": 1 - valid / positions}
    dist.destroy_process_group()
    return [{"variant": f"{name}-{layout}", "rows_per_forward": None if micro.use_dynamic_bsz else micro.rows,
             "budget": budget, "longest_row": longest, **stats[name],
             "log_prob_s": min(times[name]["log_prob"]), "update_s": min(times[name]["update"]),
             "log_prob_s_all": times[name]["log_prob"], "update_s_all": times[name]["update"]}
            for name, micro in splits.items()]


def table(result: dict) -> str:
    """The markdown page: the batch, one row per variant, dynamic / fixed ratios per layout, the machine's load."""
    rows = {r["variant"]: r for r in result["rows"]}
    b = result["batch"]
    out = [
        "# Dynamic batch size: fixed micro-batches vs token-budget micro-batches",
        "",
        f"`bench/dynamic_bsz.py`: {b['rows']} rows, prompts {b['prompt_tokens']}, responses {b['response_tokens']} "
        f"(long-tailed), {b['valid_tokens']} valid tokens; model {result['model']}; float32, {result['threads']} "
        f"threads, {result['device']}. Budget {result['budget']} tokens per forward (2 x the longest row, "
        f"{result['longest_row']}): fixed = {result['fixed_rows']} rows per forward (the most that always fit), "
        "dynamic = `use_dynamic_bsz` with that token budget. Times: the fastest of "
        f"{result['repeats']} alternating repeats (all of them in the JSON).",
        "",
        f"The machine was loaded (another job's timing run shared its 2 cores; this ran at `nice -n 19`): load "
        f"average {result['loadavg_before'][0]:.1f} before, {result['loadavg_after'][0]:.1f} after. Wall times are "
        "noisy; read the ratios of one layout's two splits, timed alternately in one process.",
        "",
        "| variant | log-prob forwards | update fwd/bwd | log-prob s | update s | most tokens / forward "
        "| most positions / forward | padding |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        out.append(f"| {r['variant']} | {r['log_prob_forwards']} | {r['update_forwards']} | {r['log_prob_s']:.2f} | "
                   f"{r['update_s']:.2f} | {r['max_tokens_per_forward']} | {r['max_positions_per_forward']} | "
                   f"{r['padding_frac']:.2f} |")
    out += ["", "| layout | forwards dynamic / fixed | log-prob time dynamic / fixed | update time dynamic / fixed "
            "| most positions / forward dynamic / fixed |", "|---|---|---|---|---|"]
    for layout in LAYOUTS:
        fixed, dyn = rows.get(f"fixed-{layout}"), rows.get(f"dynamic-{layout}")
        if fixed and dyn:
            out.append(f"| {layout} | {dyn['update_forwards'] / fixed['update_forwards']:.2f} | "
                       f"{dyn['log_prob_s'] / fixed['log_prob_s']:.2f} | {dyn['update_s'] / fixed['update_s']:.2f} | "
                       f"{dyn['max_positions_per_forward'] / fixed['max_positions_per_forward']:.2f} |")
    out += [
        "",
        "Reading: the budget counts valid tokens (verl's meaning), so a micro-batch of many short rows fills it "
        "as one of a few long rows does: fewer, fuller forwards. Packed rows (`use_remove_padding=true`, the "
        "default) compute exactly those tokens, so the budget also bounds a forward's work and memory. Padded "
        "rows compute every row at the batch's full response width, so there a token-budget micro-batch of "
        "many short rows computes (and holds activations for) more positions than its budget says, and grouping "
        "does not lower the padding fraction (responses are padded to R either way): pair `use_dynamic_bsz` "
        "with packed rows.",
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=128, help="P: longest prompt")
    ap.add_argument("--response", type=int, default=768, help="R: longest response")
    ap.add_argument("--median-response", type=int, default=64)
    ap.add_argument("--budget", type=int, default=0, help="tokens per forward; 0 = twice the longest row")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="timed log-prob pass + update pairs; the fastest counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dynamic_bsz.json"))
    ap.add_argument("--one", nargs=2, metavar=("LAYOUT", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_layout(args.one[0], args, args.one[1])))
        return

    load_before = os.getloadavg()
    model_dir = Path(tempfile.mkdtemp(prefix="rlkit-bench-")) / "model"
    save_model(model_dir, args.layers)
    passthrough = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                   if k in ("rows", "prompt", "response", "median_response", "budget", "layers", "threads", "seed",
                            "repeats")]
    rows = []
    for layout in args.layouts.split(","):
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), RLKIT_CPU_COMPUTE_DTYPE="float32")
        res = subprocess.run([sys.executable, __file__, "--one", layout, str(model_dir), *passthrough],
                             capture_output=True, text=True, env=env)
        if res.returncode:
            sys.exit(f"{layout} failed:\n{res.stderr[-3000:]}")
        rows += json.loads(res.stdout.strip().splitlines()[-1])
        for r in rows[-2:]:
            print(f"{r['variant']:15s} forwards {r['log_prob_forwards']:3d} / {r['update_forwards']:3d}  log-prob "
                  f"{r['log_prob_s']:6.2f}s  update {r['update_s']:6.2f}s  padding {r['padding_frac']:.2f}",
                  flush=True)
    p_len, r_len = lengths(args.rows, args.prompt, args.response, args.median_response, args.seed)
    quantiles = [int(r_len.float().quantile(q)) for q in (0.5, 0.9)]
    result = {
        "model": f"random Llama, {args.layers} layers, hidden 256, vocab 8192, tied",
        "device": "cpu", "threads": args.threads, "dtype": "float32",
        "batch": {"rows": args.rows, "prompt_tokens": f"{args.prompt // 4}..{args.prompt}",
                  "response_tokens": f"median {quantiles[0]}, p90 {quantiles[1]}, max {int(r_len.max())} (cut at "
                                     f"{args.response})",
                  "valid_tokens": int(p_len.sum() + r_len.sum())},
        "budget": rows[0]["budget"], "longest_row": rows[0]["longest_row"],
        "fixed_rows": next((r["rows_per_forward"] for r in rows if r["rows_per_forward"]), None),
        "repeats": args.repeats, "nice": os.nice(0), "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(), "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(table(result))
    print(table(result))
    print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
