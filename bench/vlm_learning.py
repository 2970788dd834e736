"""Vision-language learning benchmark: the CPU VLM recipe (recipes/vlm_cpu_shapes.sh) with the images, with
them blanked (the control) and without them (the questions as text only: the step-time baseline), the reward
curves, greedy validation curves and median step times as a table and JSON. The model must read the image:
only the run with images may beat chance (1/4).

Usage: .venv/bin/python bench/vlm_learning.py [--steps 80] [--runs images,blank,text] [--out bench/results/vlm_learning]
Extra key=value arguments go to `rlkit train` as overrides. Each run records the load average around it.
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
RUNS = {"images": {}, "blank": {"BLANK": "1"}, "text": {"NO_IMAGE": "1"}}  # the recipe's switches


def run(name: str, steps: int, out: Path, overrides: list[str]) -> dict:
    logs = out / name
    env = dict(os.environ, OUT=str(out / "work"), **RUNS[name])
    load_before = os.getloadavg()[0]
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
        "median_update_s": statistics.median(r["timing_s/update_actor"] for r in train),
        "median_gen_s": statistics.median(r["timing_s/gen"] for r in train),
        "load_before": load_before, "load_after": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "vlm_learning"))
    args, overrides = ap.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {name: run(name, args.steps, out, overrides) for name in args.runs.split(",")}
    (out / "vlm_learning.json").write_text(json.dumps(result, indent=1))
    print(f"{'run':7} {'reward first 10':>16} {'reward last 20':>15} {'val before':>11} {'val after':>10} "
          f"{'step s':>7} {'update s':>9} {'gen s':>6} {'load':>10}  (medians)")
    for name, r in result.items():
        val = [v["score"] for v in r["val"]] or [float("nan")]
        print(f"{name:7} {r['first10']:16.3f} {r['last20']:15.3f} {val[0]:11.3f} {val[-1]:10.3f} "
              f"{r['median_step_s']:7.2f} {r['median_update_s']:9.2f} {r['median_gen_s']:6.2f} "
              f"{r['load_before']:4.1f}-{r['load_after']:4.1f}")


if __name__ == "__main__":
    main()
