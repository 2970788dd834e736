"""rlkit side of `bench/vs_trl.py`: the real fit loop (`RLTrainer.fit`) on the benchmark workload.

Run by vs_trl.py with rlkit's own venv, one process per variant:
    .venv/bin/python bench/_rlkit_worker.py --model DIR --data FILE --out FILE.json [key=value ...]

Writes {"steps": [per-step metrics], "peak_rss_mb": ..., "config": ...}. Peak RSS is the
largest sum, sampled every 0.2 s, of the driver and the Ray worker processes (with their
children); Ray's own daemons (GCS, raylet) are reported apart as `ray_daemons_rss_mb`.
`peak_rss_shared_once_mb` is the same peak with the file-backed pages (the shared libraries: torch's
.so files alone are ~250 MB, mapped by the driver and the worker alike) counted once, as in one
process: each process's anonymous RSS summed, plus the largest file-backed RSS among them. Per
process, `peak_driver_rss_mb` and `peak_worker_rss_mb`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def workload_overrides(model: str, data: str, steps: int, rollout: str, kl_coef: float, out_dir: str) -> list[str]:
    """The benchmark workload as rlkit config: 4 prompts x 4 samples, 128 new tokens, lr 1e-6, one worker."""
    kl = [f"actor_rollout_ref.actor.use_kl_loss={'true' if kl_coef > 0 else 'false'}"]
    if kl_coef > 0:
        kl += [f"actor_rollout_ref.actor.kl_loss_coef={kl_coef}", "actor_rollout_ref.actor.kl_loss_type=low_var_kl"]
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}", "data.val_files=null", "data.shuffle=false",
        "data.train_batch_size=4", "data.max_prompt_length=256", "data.max_response_length=128",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.entropy_coeff=0.0", *kl,
        "trainer.n_gpus_per_node=1", "trainer.cpus_per_worker=2", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.logger=[]", "trainer.resume_mode=disable", f"trainer.default_local_dir={out_dir}",
    ]


def run_processes(driver: int, workers: list[int]) -> list:
    """The driver (without its children: those are Ray's daemons and idle workers) and each worker
    with its own children, each process once."""
    import psutil

    procs: dict[int, psutil.Process] = {}
    for pid in [driver, *workers]:
        try:
            proc = psutil.Process(pid)
            procs[pid] = proc
            if pid != driver:
                procs.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.Error:
            continue
    return list(procs.values())


def rss_parts(pid: int) -> tuple[int, int]:
    """(anonymous + shmem, file-backed) resident bytes of one process, from /proc/<pid>/status."""
    kb = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                key, value = line.split(":")
                kb[key] = int(value.split()[0])
    return (kb.get("RssAnon", 0) + kb.get("RssShmem", 0)) * 1024, kb.get("RssFile", 0) * 1024


class RssSampler(threading.Thread):
    """Max over time of the summed RSS of the run's processes (`run_processes`); also with the file-backed pages
    counted once (`peak_shared_once`) and per process (`peak_driver`, `peak_worker`: the largest worker tree)."""

    def __init__(self, driver: int, period_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.driver, self.workers, self.period_s, self.peak = driver, [], period_s, 0
        self.peak_shared_once = self.peak_driver = self.peak_worker = 0
        self._stop_evt = threading.Event()

    @property
    def pids(self) -> list[int]:
        return [self.driver, *self.workers]

    def sample(self) -> int:
        import psutil

        total = 0
        for p in run_processes(self.driver, self.workers):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def sample_parts(self) -> None:
        import psutil

        anon, files, workers = 0, 0, 0
        for p in run_processes(self.driver, self.workers):
            try:
                a, f = rss_parts(p.pid)
            except (OSError, psutil.Error):
                continue
            anon, files = anon + a, max(files, f)
            if p.pid == self.driver:
                self.peak_driver = max(self.peak_driver, a + f)
            else:
                workers += a + f
        self.peak_shared_once = max(self.peak_shared_once, anon + files)
        self.peak_worker = max(self.peak_worker, workers)

    def run(self) -> None:
        while not self._stop_evt.is_set():
            self.peak = max(self.peak, self.sample())
            if sys.platform.startswith("linux"):
                self.sample_parts()
            self._stop_evt.wait(self.period_s)

    def stop(self) -> int:
        self._stop_evt.set()
        self.join()
        return self.peak


def cpu_seconds(pids: list[int]) -> float:
    """user+sys CPU seconds of the run's processes (pids[0] = the driver, the rest workers)."""
    import psutil

    total = 0.0
    for p in run_processes(pids[0], pids[1:]) if pids else []:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class Capture:
    """A tracker that keeps every logged metrics dict, plus CPU seconds and load per step."""

    def __init__(self, pids: list[int] | None = None) -> None:
        self.rows: list[dict] = []
        self.pids = pids or []
        self._cpu = cpu_seconds(self.pids)

    def log(self, metrics: dict, step: int) -> None:
        cpu = cpu_seconds(self.pids)
        row = {"step": step, "perf/cpu_s": cpu - self._cpu, "load": os.getloadavg()[0]}
        self._cpu = cpu
        for k, v in metrics.items():
            try:
                row[k] = float(v)
            except (TypeError, ValueError):
                pass
        self.rows.append(row)
        keys = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "response_length/mean")
        print(f"[rlkit] step {step}: " + ", ".join(f"{k}={row.get(k, float('nan')):.2f}" for k in keys), flush=True)

    def finish(self) -> None:
        pass


def ray_daemon_rss_mb() -> float:
    import psutil

    total = 0
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "gcs_server" in cmd or "raylet" in cmd or "dashboard" in cmd or "log_monitor" in cmd:
                total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rollout", default="vllm")
    ap.add_argument("--kl-coef", type=float, default=0.0)
    args, extra = ap.parse_known_args()

    import ray
    from rich.console import Console

    from rlkit.config.load import to_dict
    from rlkit.trainer.run.launch import LaunchOptions, init_ray
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer

    with tempfile.TemporaryDirectory(prefix="rlkit-bench-") as tmp:
        overrides = workload_overrides(args.model, args.data, args.steps, args.rollout, args.kl_coef, tmp) + extra
        cfg = load_config("grpo", overrides)
        start = time.perf_counter()
        init_ray(cfg, LaunchOptions(num_cpus=os.cpu_count()), Console(stderr=True))
        trainer = None
        try:
            sampler = RssSampler(os.getpid())
            sampler.start()
            trainer = RLTrainer(cfg)
            sampler.workers += ray.get([a.pid.remote() for g in trainer.workers.groups for a in g.actors])
            init_s = time.perf_counter() - start
            capture = Capture(sampler.pids)
            trainer.tracker = capture
            trainer.save_checkpoint = lambda: None  # not part of the workload (would land in the last step's CPU time)
            trainer.fit()
            peak = sampler.stop()
            result = {
                "framework": "rlkit",
                "rollout": args.rollout,
                "kl_coef": args.kl_coef,
                "overrides": extra,
                "init_s": init_s,
                "steps": capture.rows,
                "peak_rss_mb": peak / 2**20,
                "peak_rss_shared_once_mb": sampler.peak_shared_once / 2**20,
                "peak_driver_rss_mb": sampler.peak_driver / 2**20,
                "peak_worker_rss_mb": sampler.peak_worker / 2**20,
                "ray_daemons_rss_mb": ray_daemon_rss_mb(),
                "config": to_dict(cfg),
            }
        finally:
            if trainer is not None:
                trainer.workers.shutdown()
            ray.shutdown()
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"[rlkit] wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
