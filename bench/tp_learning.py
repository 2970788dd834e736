"""The toy GRPO run learns at tensor parallel 2 (issue 46), judged as tests/trainer/test_learning.py judges learning:
first-10 mean train reward < 0.2, last-20 mean > 0.5 over 100 steps. Outside the suite's time budget (~3 min a run
on 2 shared cores); the suite's tp=2 run is the 3-step equality test, tests/trainer/test_tensor_parallel_run.py.

    .venv/bin/python bench/tp_learning.py                 # tp2, then dp2 -> bench/results/tp_learning.json
    .venv/bin/python bench/tp_learning.py --no-baseline   # tp2 alone

Entries `tp2` (2 workers, one TP group) and `dp2` (the same 2 workers data parallel, the baseline) of
bench/learning_variants.py, float32 compute, the same seeds: the two sample the same responses until float noise
(~1e-7 relative in the update) flips one sampled token, then the curves go their own ways; the JSON records both
reward curves, the last step at which they were still equal, and each run's wall time and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import learning_variants as lv  # bench/ is this script's folder, first on sys.path


def same_until(a: list[float], b: list[float]) -> int:
    """The number of leading steps with equal mean reward."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-baseline", action="store_true", help="skip the dp2 run")
    ap.add_argument("--out", default=str(lv.ROOT / "bench" / "results" / "tp_learning.json"))
    args = ap.parse_args()
    os.environ.setdefault("RLKIT_CPU_COMPUTE_DTYPE", "float32")  # as the suite's learning tests are calibrated
    names = ["tp2"] if args.no_baseline else ["tp2", "dp2"]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="rlkit-tp-learning-") as tmp:
        data = lv.toy_data(Path(tmp))
        for name in names:
            rows[name] = row = lv.run_entry(name, Path(tmp), data)
            print(f"{name}: train reward first 10 {row['first10']:.3f} -> last 20 {row['last20']:.3f}; greedy val "
                  f"{row['val_before']:.3f} -> {row['val_after']:.3f}; median step {row['median_step_s']:.2f}s; "
                  f"wall {row['wall_s']:.0f}s (load {row['load_avg']}); ok {row['ok']}", flush=True)
    result: dict = {"runs": list(rows.values())}
    if "dp2" in rows:
        result["same_scores_steps"] = same_until(rows["tp2"]["scores"], rows["dp2"]["scores"])
        print(f"tp2 and dp2 sampled the same rewards for the first {result['same_scores_steps']} steps")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if rows["tp2"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
