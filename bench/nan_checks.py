"""What `--debug nan` costs: the checks of one update micro-batch (loss, log-probs, every gradient) against the
micro-batch's forward + backward, on a random Llama (`--layers`, hidden `--hidden`, vocab 8192), float32 on CPU
(or CUDA with --device cuda). Off, each check is one cached lookup; the off time is measured too.

    nice -n 19 .venv/bin/python bench/nan_checks.py                      # 4 layers, hidden 256, 16 x 256 tokens
    nice -n 19 .venv/bin/python bench/nan_checks.py --device cuda --hidden 1024 --layers 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlkit.debug import anomaly

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                         num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(args.device)
    ids = torch.randint(0, 8192, (args.rows, args.tokens), device=args.device)

    def step(on: bool) -> tuple[float, float]:
        """(forward + backward seconds, check seconds) of one micro-batch."""
        model.zero_grad(set_to_none=True)
        sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        logits = model(ids).logits
        lp = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        loss = -lp.mean()
        sync()
        t1 = time.perf_counter()
        anomaly.check_tensor("log-prob", lp.detach(), None, "bench")
        anomaly.watch_gradient(lp, None)
        anomaly.check_tensor("loss", loss, None, "bench")
        checks = time.perf_counter() - t1
        t2 = time.perf_counter()
        loss.backward()
        sync()
        t3 = time.perf_counter()
        anomaly.check_gradients(model, None, "bench")
        sync()
        checks += time.perf_counter() - t3
        return (t1 - t0) + (t3 - t2), checks

    results = {}
    for mode in ("off", "stop", "off", "stop"):  # alternated: a change in the machine's load hits both
        if mode == "off":
            os.environ.pop(anomaly.ANOMALY_ENV, None)
        else:
            os.environ[anomaly.ANOMALY_ENV] = mode
        anomaly.anomaly_mode.cache_clear()
        runs = [step(mode != "off") for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r[0] + r[1])
        results.setdefault(mode, []).append(best)
    off = min(results["off"], key=sum)
    on = min(results["stop"], key=sum)
    params = sum(p.numel() for p in model.parameters())
    report = {"params": params, "tokens": args.rows * args.tokens, "device": args.device,
              "fwd_bwd_s": round(on[0], 4), "checks_on_s": round(on[1], 5), "checks_off_s": round(off[1], 7),
              "overhead_on": round(on[1] / on[0], 4)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
