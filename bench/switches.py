"""What each training-side switch buys: the actor's update (and log-prob pass) on the benchmark batch.

    .venv/bin/python bench/switches.py                       # all variants -> bench/results/switches.json
    .venv/bin/python bench/switches.py --only packed+resp_logits,plain --repeats 3

Runs `ActorWorker.update_actor` / `compute_log_prob` in this process (a 1-rank gloo group,
exactly the code a Ray worker runs) on a fixed batch shaped like the vs_trl workload:
4 GSM8K prompts x 4 samples, prompts left-padded to 256 tokens, responses of fixed lengths
(mostly the 128 cap, as SmolLM2 produces on GSM8K). Each variant builds a fresh actor, does
one warm-up update, then `--repeats` timed ones; the table shows medians and the peak RSS
growth during the updates. Generation is not involved (see vs_trl.py for the whole step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> overrides on top of the workload (bench/_rlkit_worker.py)
VARIANTS: dict[str, list[str]] = {
    "plain": ["actor_rollout_ref.model.use_remove_padding=false", "actor_rollout_ref.model.response_logits_only=false"],
    "packed": ["actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.response_logits_only=false"],
    "resp_logits": [],  # the defaults: padded rows (shared left padding trimmed), response-only logits
    "packed+resp_logits": ["actor_rollout_ref.model.use_remove_padding=true"],
    "packed+resp_logits+micro16": ["actor_rollout_ref.model.use_remove_padding=true",
                                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"],
    "packed+resp_logits+dyn4096": ["actor_rollout_ref.model.use_remove_padding=true",
                                   "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                   "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"],
    "resp_logits+bf16": ["actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16"],
    "resp_logits+micro8": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],
    "resp_logits+micro16": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"],
    "packed+resp_logits+compile": ["actor_rollout_ref.model.use_remove_padding=true",
                                   "actor_rollout_ref.model.use_torch_compile=true"],
}
RESPONSE_LENGTHS = [128] * 10 + [64, 80, 96, 104, 112, 120]


def build_batch(model_path: str, data: str, seed: int = 0):
    """16 rows: the first 4 prompts of `data` x 4, random response tokens of RESPONSE_LENGTHS."""
    import numpy as np
    import torch

    from rlkit.data import RLDataset
    from rlkit.models.loading import load_tokenizer
    from rlkit.rollout.base import assemble_output

    tok = load_tokenizer(model_path)
    prompts = RLDataset(data, tok, 256, "filter", "prompt").get_batch(np.arange(4)).repeat(4, interleave=True)
    gen = torch.Generator().manual_seed(seed)
    rows, length = len(prompts), 128
    responses = torch.randint(100, tok.vocab_size - 100, (rows, length), generator=gen)
    mask = torch.zeros(rows, length, dtype=torch.long)
    for i, n in enumerate(RESPONSE_LENGTHS[:rows]):
        mask[i, :n] = 1
    responses = torch.where(mask.bool(), responses, tok.pad_token_id)
    batch = assemble_output(prompts.select(["input_ids", "attention_mask", "position_ids"]), responses, mask)
    batch["advantages"] = torch.randn(rows, 1, generator=gen).expand(rows, length) * mask
    return batch


def init_process_group() -> None:
    import torch.distributed as dist

    from rlkit.controller.worker import free_port

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=0,
                                world_size=1)


def run_variant(name: str, overrides: list[str], model: str, data: str, batch, repeats: int) -> dict:
    import gc

    import psutil
    from _rlkit_worker import RssSampler, workload_overrides  # noqa: I001 - bench-local module

    from rlkit.trainer.run.roles import actor_role
    from rlkit.trainer.run.run_config import load_config

    cfg = load_config("grpo", workload_overrides(model, data, 100, "hf", 0.0, "/tmp/rlkit-switches") + overrides)
    role = actor_role(cfg, model, 100)
    actor = role.cls(*role.args, **role.kwargs)
    actor.init_model()
    start = time.perf_counter()
    actor.update_actor(batch)  # warm-up (with use_torch_compile: the compilation)
    warmup_s = time.perf_counter() - start
    base_rss = psutil.Process().memory_info().rss
    sampler = RssSampler(os.getpid(), period_s=0.05)
    sampler.start()
    update_s, logprob_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        actor.update_actor(batch)
        update_s.append(time.perf_counter() - start)
    for _ in range(repeats):
        start = time.perf_counter()
        actor.compute_log_prob(batch)
        logprob_s.append(time.perf_counter() - start)
    peak = sampler.stop()
    row = {
        "variant": name, "overrides": overrides, "warmup_s": warmup_s,
        "update_s": statistics.median(update_s), "update_s_all": update_s,
        "log_prob_s": statistics.median(logprob_s), "log_prob_s_all": logprob_s,
        "rss_growth_mb": max(0, peak - base_rss) / 2**20, "load_avg_1m": os.getloadavg()[0],
    }
    print(f"  {name:28s} warm-up {warmup_s:7.2f}s  update {row['update_s']:7.2f}s  log-prob {row['log_prob_s']:6.2f}s  "
          f"+RSS {row['rss_growth_mb']:6.0f} MB  (load {row['load_avg_1m']:.1f})", flush=True)
    del actor
    gc.collect()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--data", default=None, help="GSM8K train parquet (default: made with `rlkit data gsm8k`)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated variant names")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "switches.json"))
    args = ap.parse_args()

    from vs_trl import ensure_data  # noqa: I001 - bench-local module

    from rlkit.models.resolve import resolve_model_path

    model = str(resolve_model_path(args.model))
    data = args.data or str(ensure_data())
    names = args.only.split(",") if args.only else list(VARIANTS)
    init_process_group()
    batch = build_batch(model, data)
    tokens = int(batch["attention_mask"].sum())
    print(f"switches: {len(batch)} rows, {tokens} valid tokens of {batch['attention_mask'].numel()} "
          f"({batch['input_ids'].shape[1]} columns), {args.repeats} repeats", flush=True)
    rows = [run_variant(n, VARIANTS[n], model, data, batch, args.repeats) for n in names]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "valid_tokens": tokens, "cells": batch["attention_mask"].numel(),
                               "response_lengths": RESPONSE_LENGTHS}, indent=1))
    print(f"switches: wrote {out}")


if __name__ == "__main__":
    main()
