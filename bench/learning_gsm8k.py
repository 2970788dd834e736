"""Learning benchmark: the CPU quickstart recipe run longer, with the reward/accuracy curve as JSON and PNG.

Usage: .venv/bin/python bench/learning_gsm8k.py [--steps 30] [--test-freq 10] [--out bench/results/learning_gsm8k]
Extra key=value arguments go to `rlkit train` as overrides.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--test-freq", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "learning_gsm8k"))
    args, overrides = ap.parse_known_args()
    out = Path(args.out)
    ckpt = Path.home() / ".cache" / "rlkit" / "bench" / "learning_gsm8k_checkpoints"  # GBs: not in the repo
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        "bash", str(ROOT / "recipes" / "quickstart_cpu.sh"),
        f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.test_freq}",
        f"trainer.default_local_dir={ckpt}", f"trainer.log_dir={out / 'logs'}", "trainer.logger=[file]",
        *overrides,
    ]
    start = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    rows = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    curve = {
        "wall_s": time.time() - start,
        "train": [
            {"step": r["step"], "score": r.get("critic/score/mean"), "acc": r.get("reward/acc/mean"),
             "response_length": r.get("response_length/mean"), "step_s": r.get("timing_s/step")}
            for r in rows if "critic/score/mean" in r
        ],
        "val": [{"step": r["step"], **{k: v for k, v in r.items() if k.startswith("val/")}}
                for r in rows if any(k.startswith("val/") for k in r)],
    }
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    plot(curve, out / "curve.png")
    print(json.dumps({"wall_s": curve["wall_s"], "first_train": curve["train"][:3], "last_train": curve["train"][-3:],
                      "val": curve["val"]}, indent=1))


def plot(curve: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the PNG (pip install matplotlib)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in curve["train"]]
    ax.plot(steps, [r["score"] for r in curve["train"]], label="train reward (mean)", alpha=0.6)
    val_keys = {k for r in curve["val"] for k in r if k.startswith("val/") and ("/score/" in k or "/acc/" in k)}
    for key in sorted(val_keys):
        ax.plot([r["step"] for r in curve["val"] if key in r], [r[key] for r in curve["val"] if key in r],
                marker="o", label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("score / accuracy")
    ax.legend()
    ax.set_title("GRPO on GSM8K, SmolLM2-135M-Instruct, 2-core CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
