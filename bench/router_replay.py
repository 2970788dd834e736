"""MoE routing replay: how often an hf rollout engine picks other experts than the float32 trainer for the same
tokens, and the engine-vs-trainer log-prob gap on those rollouts with and without replaying the engine's routes.

    python bench/router_replay.py --experts 4 32 --dtypes float32 bfloat16

Tiny random Qwen3-MoE (top-2, 2 layers), 64 toy prompts, sampled responses. Table on stdout, JSON in
bench/results/router_replay.json (docs/moe.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from rlkit.config.schema import FSDPConfig
from rlkit.protocol import Batch
from rlkit.rollout import HFRollout, RolloutConfig
from rlkit.testing import build_tiny_tokenizer, save_tiny_moe
from rlkit.workers.fsdp_model import FSDPModel


def prompts(n: int = 8) -> Batch:
    tok = build_tiny_tokenizer()
    enc = tok([f"copy the digits : {i} {j}" for i in range(n) for j in range(n)], padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    return Batch({"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(0)})


def measure(model: Path, dtype: str, response_length: int) -> dict[str, float]:
    cfg = RolloutConfig(
        prompt_length=32,
        response_length=response_length,
        max_num_seqs=64,
        seed=0,
        dtype=dtype,
        calculate_log_probs=True,
    )
    sampling = cfg.to_sampling()
    sampling.return_routed_experts = True
    out = HFRollout(model, cfg).generate(prompts(), sampling)
    trainer = FSDPModel(str(model), FSDPConfig(), torch.device("cpu"))
    args = (out["input_ids"], out["attention_mask"], out["position_ids"], response_length)
    with trainer.router_tap.recording(), torch.no_grad():
        plain = trainer.forward(*args).log_probs
    own = torch.stack(trainer.router_tap.indices, dim=1)  # (valid tokens, layers, k)
    given = out["routed_experts"][out["attention_mask"].bool()].long()
    has = given[:, 0, 0] >= 0
    differ = (own[has].sort(-1).values != given[has].sort(-1).values).any(-1)  # (tokens, layers)
    with torch.no_grad():
        replayed = trainer.forward(*args, routed_experts=out["routed_experts"]).log_probs
    resp = out["response_mask"].bool()

    def gap(lp: torch.Tensor) -> float:
        return float((lp - out["rollout_log_probs"]).abs()[resp].mean())

    return {
        "routed_pairs": differ.numel(),
        "pairs_differing": float(differ.float().mean()),
        "tokens_differing": float(differ.any(-1).float().mean()),
        "gap": gap(plain),
        "gap_replay": gap(replayed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--out", default="bench/results/router_replay.json")
    a = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for experts in a.experts:
            model = save_tiny_moe(Path(tmp) / f"moe{experts}", sharpen=1.0, hidden=128, heads=2, experts=experts)
            for dtype in a.dtypes:
                rows.append({"experts": experts, "engine_dtype": dtype, **measure(model, dtype, a.response_length)})
    print(f"{'experts':>7} {'engine':>9} {'pairs':>6} {'differ':>7} {'tokens':>7} {'gap':>10} {'gap replay':>10}")
    for r in rows:
        print(
            f"{r['experts']:>7} {r['engine_dtype']:>9} {r['routed_pairs']:>6} {r['pairs_differing']:>7.2%} "
            f"{r['tokens_differing']:>7.2%} {r['gap']:>10.3e} {r['gap_replay']:>10.3e}"
        )
    Path(a.out).write_text(
        json.dumps({"trainer_dtype": "float32", "response_length": a.response_length, "rows": rows}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
