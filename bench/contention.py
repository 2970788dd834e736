"""Shared cores: how much one competing CPU-bound process slows an actor update step, by OpenMP wait policy.

    .venv/bin/python bench/contention.py                  # -> bench/results/contention.json
    .venv/bin/python bench/contention.py --threads 2,1 --repeats 5

The step is `bench/precision.py`'s update (forward + backward + AdamW of a random model with SmolLM2-135M's
shape, `--layers` of its 30, float32), each configuration in its own process. For every torch thread count
and OpenMP wait policy (unset = the runtime's default spin-then-sleep, PASSIVE = sleep at once), it is timed
on the idle machine and again while one other process spins on a core (`while True: pass`), the situation
of a worker sharing a 2-core machine with a test run, a second worker or an editor's language server.
slowdown = median step with the competitor / median step idle. Run it on an otherwise idle machine: the
load average before and after is printed and stored.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "contention.json"
POLICIES = {"default": None, "passive": "PASSIVE"}
# the other process: a pure-Python spinner (one busy core), or another torch process with 2 OpenMP threads doing
# matmuls under the same wait policy (two workers, or a worker and a test run, each sized for the whole machine)
COMPETITORS = {
    "spin": "while True: pass",
    "torch": "import torch\ntorch.set_num_threads(2)\na = torch.randn(384, 384)\nwhile True:\n    a @ a",
}


def child(model_dir: Path, rows: int, prompt: int, response: int, repeats: int) -> None:
    """One configuration (threads and wait policy come from the environment): prints the step times as JSON."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from precision import update_step_seconds

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    out = update_step_seconds(model_dir, "float32", rows, prompt, response, repeats)
    print(json.dumps(out))


def _env(threads: int, policy: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("OMP_WAIT_POLICY", None)
    if POLICIES[policy]:
        env["OMP_WAIT_POLICY"] = POLICIES[policy]
    return env


def run_one(args: argparse.Namespace, model_dir: Path, threads: int, policy: str, competitor: str | None) -> dict:
    env = _env(threads, policy)
    spinner = (subprocess.Popen([sys.executable, "-c", COMPETITORS[competitor]], env=_env(2, policy))
               if competitor else None)
    try:
        cmd = [sys.executable, __file__, "--child", str(model_dir), "--rows", str(args.rows), "--prompt",
               str(args.prompt), "--response", str(args.response), "--repeats", str(args.repeats)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    times = json.loads(res.stdout.strip().splitlines()[-1])["times_s"][1:]  # after the warm-up step
    return {"threads": threads, "policy": policy, "competitor": competitor, "times": times,
            "median_s": statistics.median(times)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--threads", default="2,1", help="torch thread counts to try")
    ap.add_argument("--policies", default="default,passive", help=f"of {list(POLICIES)}")
    ap.add_argument("--competitors", default="spin,torch", help=f"of {list(COMPETITORS)}")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.rows, args.prompt, args.response, args.repeats)
        return {}
    sys.path.insert(0, str(ROOT / "bench"))
    from long_context import save_model

    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        save_model(model_dir, args.layers)
        for threads in [int(t) for t in args.threads.split(",")]:
            for policy in args.policies.split(","):
                idle = run_one(args, model_dir, threads, policy, None)
                rows.append(idle)
                for competitor in args.competitors.split(","):
                    busy = run_one(args, model_dir, threads, policy, competitor)
                    busy["slowdown"] = busy["median_s"] / idle["median_s"]
                    rows.append(busy)
                    print(f"threads {threads}  OMP_WAIT_POLICY {policy:8s} idle {idle['median_s']:6.2f}s  with a "
                          f"{competitor:5s} competitor {busy['median_s']:6.2f}s  slowdown {busy['slowdown']:5.2f}x",
                          flush=True)
                    time.sleep(1)
    result = {"layers": args.layers, "rows": args.rows, "tokens": args.prompt + args.response, "cpus": os.cpu_count(),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "rows_measured": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"load average before {load_before[0]:.2f}, after {result['loadavg_after'][0]:.2f}; wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
