"""Dense vs MoE of the same active size: the actor's forward + backward time per micro-batch on CPU.

A Llama-style dense model and a Mixtral-style MoE with the same attention, embeddings and depth, whose
experts are sized so the matmul weights one token passes through (`rlkit.utils.flops.matmul_params_per_token`)
are the same: dense MLP width I, MoE `experts` experts of width I / top_k, top_k per token. The MoE holds
more weights in total (`matmul_params_total`) and pays for routing, the per-expert gather/scatter of tokens
and smaller matmuls; this measures what that costs in a training step. Both run through `FSDPModel` (one
worker, float32, packed rows, the same path as the actor) with the same random tokens; the two models
alternate rep by rep so load on a shared machine hits both alike, and the median is reported.

    .venv/bin/python bench/moe_step.py                    # hidden 256, 4 layers, 8 experts top-2
    .venv/bin/python bench/moe_step.py --reps 3 --rows 4  # quicker
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "bench" / "results" / "moe_step.json"


def build_models(root: Path, hidden: int, layers: int, inter: int, experts: int, top_k: int) -> dict[str, Path]:
    """Save the dense and the MoE model (random weights, same seed) under `root`; returns name -> folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    common = dict(
        vocab_size=4096,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    folders = {}
    for name, model in (
        ("dense", lambda: LlamaForCausalLM(LlamaConfig(intermediate_size=inter, **common))),
        (
            "moe",
            lambda: MixtralForCausalLM(
                MixtralConfig(
                    intermediate_size=inter // top_k, num_local_experts=experts, num_experts_per_tok=top_k, **common
                )
            ),
        ),
    ):
        torch.manual_seed(0)
        folders[name] = root / name
        model().save_pretrained(folders[name])
    return folders


def step_seconds(model, rows: int, length: int, seed: int) -> float:
    """One packed forward + backward of `rows` full rows of `length` tokens (log-probs of the last half)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 4096, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    pos = torch.arange(length).expand(rows, length)
    start = time.perf_counter()
    out = model.forward(ids, mask, pos, length // 2, remove_padding=True)
    out.log_probs.sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=1024, help="the dense MLP width (MoE experts: / top-k)")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    import torch

    from rlkit.config.schema import FSDPConfig
    from rlkit.utils.flops import matmul_params_per_token, matmul_params_total
    from rlkit.workers.fsdp_model import FSDPModel

    with tempfile.TemporaryDirectory() as tmp:
        folders = build_models(Path(tmp), args.hidden, args.layers, args.intermediate, args.experts, args.top_k)
        models = {name: FSDPModel(str(path), FSDPConfig(), torch.device("cpu")) for name, path in folders.items()}
        times: dict[str, list[float]] = {name: [] for name in models}
        for rep in range(args.reps + 1):  # rep 0 warms up (allocator, oneDNN primitives)
            for name, model in models.items():
                seconds = step_seconds(model, args.rows, args.length, seed=rep)
                model.module.zero_grad(set_to_none=True)
                if rep > 0:
                    times[name].append(seconds)
        tokens = args.rows * args.length
        results = []
        for name, model in models.items():
            config = model.module.config
            median = statistics.median(times[name])
            results.append(
                {
                    "model": name,
                    "active_matmul_params_per_token": matmul_params_per_token(config),
                    "matmul_params_total": matmul_params_total(config),
                    "step_s_median": median,
                    "step_s_all": times[name],
                    "tokens_per_s": tokens / median,
                }
            )
    dense = results[0]["step_s_median"]
    print(f"{'model':6} {'active/token':>13} {'total':>11} {'fwd+bwd s':>10} {'tokens/s':>9} {'vs dense':>9}")
    for r in results:
        active, total = r["active_matmul_params_per_token"] / 1e6, r["matmul_params_total"] / 1e6
        print(
            f"{r['model']:6} {active:12.2f}M {total:10.2f}M {r['step_s_median']:10.3f} {r['tokens_per_s']:9.0f} "
            f"{r['step_s_median'] / dense:8.2f}x"
        )
    record = {
        "workload": {k: v for k, v in vars(args).items() if k != "out"} | {"tokens_per_step": tokens},
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out} (load average {record['load_average'][0]:.1f})")


if __name__ == "__main__":
    main()
