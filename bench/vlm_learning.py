"""Vision-language learning benchmark: the CPU VLM recipe (recipes/vlm_cpu_shapes.sh) with the images and with
them blanked (the control), the two reward curves, their step times and the greedy validation scores as a table
and JSON. The model must read the image: only the run with images may beat chance (1/4).

Usage: .venv/bin/python bench/vlm_learning.py [--steps 150] [--out bench/results/vlm_learning]
Extra key=value arguments go to `rlkit train` as overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VAL = "val/rlkit/shapes/score/mean@1"


def run(blank: bool, steps: int, out: Path, overrides: list[str]) -> dict:
    logs = out / ("blank" if blank else "images")
    env = dict(os.environ, BLANK=str(int(blank)), OUT=str(out / "work"))
    subprocess.run(["bash", str(ROOT / "recipes" / "vlm_cpu_shapes.sh"), f"trainer.total_training_steps={steps}",
                    f"trainer.log_dir={logs}", "trainer.logger=[file]", *overrides], check=True, cwd=ROOT, env=env)
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "critic/score/mean" in r]
    scores = [r["critic/score/mean"] for r in train]
    return {
        "curve": [{"step": r["step"], "score": r["critic/score/mean"], "step_s": r.get("timing_s/step")}
                  for r in train],
        "val": [{"step": r["step"], "score": r[VAL]} for r in rows if VAL in r],
        "first10": statistics.fmean(scores[:10]), "last20": statistics.fmean(scores[-20:]),
        "median_step_s": statistics.median(r["timing_s/step"] for r in train),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vlm_learning"))
    args, overrides = ap.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {name: run(blank, args.steps, out, overrides) for name, blank in (("images", False), ("blank", True))}
    (out / "vlm_learning.json").write_text(json.dumps(result, indent=1))
    print(f"{'run':8} {'reward first 10':>16} {'reward last 20':>15} {'val before':>11} {'val after':>10} "
          f"{'step s (median)':>16}")
    for name, r in result.items():
        val = [v["score"] for v in r["val"]] or [float("nan")]
        print(f"{name:8} {r['first10']:16.3f} {r['last20']:15.3f} {val[0]:11.3f} {val[-1]:10.3f} "
              f"{r['median_step_s']:16.2f}")


if __name__ == "__main__":
    main()
