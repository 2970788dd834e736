"""Ctrl-C at random moments of `rlkit train` (start-up and training): each must stop the run once, exit 130, print one
line, and leave no process behind. A signal that comes after the last step, while the finished run shuts down,
lets it complete (exit 0, its summary printed): counted as `finished_before_signal`, not as a failure.

Each try starts `rlkit train grpo` on the toy task with a tiny model in its own session (a terminal's process group),
waits a chosen time, sends SIGINT to the group (what Ctrl-C does) and checks: the exit status, the `interrupted`
lines on stderr (exactly one, the last line), no traceback, and that no process of the run is left once the driver
has exited (every process started for the try carries a marker in its environment, Ray's included).

    nice -n 19 .venv/bin/python bench/ctrl_c.py --moments 20            # 20 random moments in 0.3..30 s
    nice -n 19 .venv/bin/python bench/ctrl_c.py --at '1,@starting Ray+2,@step 2/' --out r.json   # chosen moments
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MARK = "RLKIT_CTRL_C_TRY"


def make_inputs(root: Path) -> tuple[Path, Path]:
    from typer.testing import CliRunner

    from rlkit.testing import save_tiny_model
    from rlkit_cli.main import app

    made = CliRunner().invoke(app, ["data", "toy", "--out", str(root / "toy"), "--length", "1"])
    assert made.exit_code == 0, made.output
    return root / "toy", save_tiny_model(root / "model", tie_embeddings=True)


def train_argv(data: Path, model: Path, out: Path, steps: int) -> list[str]:
    rlkit = Path(sys.executable).with_name("rlkit")
    prog = [str(rlkit)] if rlkit.is_file() else [sys.executable, "-c", "from rlkit_cli.main import main; main()"]
    return [*prog, "train", "grpo", f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf", "data.max_prompt_length=32",
            "data.max_response_length=3", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.n=4", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
            "trainer.cpus_per_worker=1", f"trainer.default_local_dir={out}/ckpt", f"trainer.log_dir={out}/logs",
            "trainer.logger=[console,file]", "trainer.save_freq=5"]


def marked_processes(tag: str) -> list[str]:
    """`pid name` of every live process whose environment carries the try's marker."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get(MARK) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {proc.info['name']}")
        except psutil.Error:
            continue
    return found


def one_try(argv: list[str], out: Path, at: str, timeout_s: float = 120.0) -> dict:
    """Start the run, Ctrl-C its process group at `at` (seconds after the start, or `@TEXT`: once TEXT is in the
    run's output, plus `+S` seconds if given), and report what happened."""
    tag = uuid.uuid4().hex
    env = {**os.environ, MARK: tag, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        proc = subprocess.Popen(argv, stdout=so, stderr=se, env=env, cwd=ROOT, start_new_session=True,
                                stdin=subprocess.DEVNULL)
        started = time.monotonic()
        wait_for(at, proc, out, timeout_s)
        at_s = time.monotonic() - started
        finished_first = proc.poll() is not None
        if not finished_first:
            os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        stop_s = time.monotonic() - sent
        left = marked_processes(tag)
        for line in left:  # clean up for the next try, after recording the failure
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if rc is None:
            proc.kill()
    stderr = (out / "stderr").read_text()
    # the signal came after the last step, while the finished run shut down: it completes (exit 0, its summary)
    finished_first = finished_first or (rc == 0 and "run summary" in (out / "stdout").read_text())
    lines = stderr.strip().splitlines()
    interrupted = [line for line in lines if line.startswith("interrupted ")]
    ok = (finished_first or (rc == 130 and len(interrupted) == 1 and lines[-1] == interrupted[0]
                             and "Traceback" not in stderr and not left))
    return {"at": at, "at_s": round(at_s, 2), "rc": rc, "finished_before_signal": finished_first,
            "stop_s": round(stop_s, 2), "last_line": lines[-1][:100] if lines else "",
            "interrupted_lines": len(interrupted), "traceback": "Traceback" in stderr, "left_processes": left, "ok": ok}


def wait_for(at: str, proc: subprocess.Popen, out: Path, timeout_s: float) -> None:
    """Sleep until the moment `at` names (see one_try), or the run ends."""
    if not at.startswith("@"):
        time.sleep(float(at))
        return
    text, _, extra = at[1:].partition("+")
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if any(text in (out / name).read_text(errors="replace") for name in ("stdout", "stderr")):
            break
        time.sleep(0.1)
    time.sleep(float(extra or 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moments", type=int, default=20, help="random moments (ignored with --at)")
    parser.add_argument("--at", default="", help="comma-separated moments instead of random ones: seconds after the "
                        "start, or @TEXT[+S] (S seconds after TEXT appears in the run's output)")
    parser.add_argument("--window-s", type=float, default=30.0, help="random moments fall in 0.3..this")
    parser.add_argument("--steps", type=int, default=80, help="training steps (so that the run outlasts the window)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    moments = (args.at.split(",") if args.at else
               [str(round(rng.uniform(0.3, args.window_s), 2)) for _ in range(args.moments)])
    with tempfile.TemporaryDirectory(prefix="rlkit-ctrl-c-") as tmp:
        root = Path(tmp)
        data, model = make_inputs(root)
        results = []
        for i, at in enumerate(moments):
            result = one_try(train_argv(data, model, root / f"try{i}", args.steps), root / f"try{i}", at)
            results.append(result)
            print(json.dumps(result), flush=True)
    summary = {"tries": len(results), "ok": sum(r["ok"] for r in results),
               "finished_before_signal": sum(r["finished_before_signal"] for r in results),
               "max_stop_s": max(r["stop_s"] for r in results), "results": results}
    print(f"{summary['ok']}/{summary['tries']} ok; slowest stop {summary['max_stop_s']:.1f}s")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    sys.exit(0 if summary["ok"] == summary["tries"] else 1)


if __name__ == "__main__":
    main()
