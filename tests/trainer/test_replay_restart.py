"""Step replay, deterministic runs and surviving a dead worker, on real runs (float32 CPU, the toy task).

One uninterrupted GRPO run (module fixture; `trainer.deterministic=true`, 6 steps, a checkpoint every 2, steps 3
and 4 recorded) serves three tests:
- replay: `replay_step(checkpoint root, 4)` in a fresh process, from the step-2 checkpoint through the records of
  steps 3 and 4, returns the loss and gradient norm the run logged and the weights of its step-4 checkpoint, bit
  for bit; `--role rollout` generates step 4's responses again, all equal;
- restart + determinism: the same config again, its actor worker SIGKILLed in step 4: the run restarts the workers
  from the step-2 checkpoint, finishes all 6 steps, logs each step once, and every row (timings aside) and the
  final weights equal the first run's;
- pdb: `rlkit debug replay` in a subprocess stops at a plain `breakpoint()` inside the replayed `update_actor` and
  at `--break-at actor.update_policy`, in its own process, driven over stdin.
A PPO run (actor + critic) checks the same replay equality for both trained roles.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import REPO, cli_env, ensure_ray, read_metrics, rlkit_cmd, toy_overrides

pytestmark = pytest.mark.slow  # real runs (~20-60 s each on 2 shared cores), as tests/trainer/test_cli_resume.py's

STEPS, SAVE_EVERY, KILL_IN = 6, 2, 4
VARYING = ("timing_s/", "perf/", "memory/", "time")  # wall-clock values: the only ones two runs may differ in


def _run(algo: str, overrides: list[str], log_dir: Path, during=None) -> dict:
    """One run in this process on the shared local Ray; `during(trainer)` starts alongside `fit`. Returns the
    final actor weights, the metrics rows and the trainer."""
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    ensure_ray()
    with Tracking(["file"], log_dir=log_dir) as tracker:
        trainer = RLTrainer(load_config(algo, overrides), tracker=tracker)
        if during is not None:
            during(trainer)
        try:
            summary = trainer.fit()
            state = trainer.workers.actor.full_state_dict()[0]
        finally:
            trainer.workers.shutdown()
    return {"state": state, "rows": read_metrics(log_dir), "summary": summary, "trainer": trainer}


def _grpo_overrides(toy_data: Path, tiny_model: Path, out: Path) -> list[str]:
    return toy_overrides(toy_data, tiny_model, out, trainer__total_training_steps=STEPS,
                         trainer__save_freq=SAVE_EVERY, trainer__max_actor_ckpt_to_keep="null",
                         trainer__deterministic=True, trainer__debug__record_steps="[3,4]")


@pytest.fixture(scope="module")
def grpo(toy_data, tiny_model, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("grpo")
    started = time.perf_counter()
    run = _run("grpo", _grpo_overrides(toy_data, tiny_model, out), out / "logs")
    print(f"\n[uninterrupted GRPO run: {STEPS} steps in {time.perf_counter() - started:.1f}s, median step "
          f"{sorted(run['summary'].step_seconds)[STEPS // 2]:.2f}s]")
    return {**run, "out": out}


def in_fresh_process(fn, *args):
    """`fn(*args)` in a new interpreter, its exception raised here: a replay turns its process into a one-worker
    host (rank env, deterministic torch), and an in-process vLLM engine built earlier in the same pytest process
    moves its float results off the run's (seen, cause not found), so each replay gets a clean process."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _checkpoint_weights(checkpoint: Path, record_dir: Path, role: str) -> dict[str, torch.Tensor]:
    """A role's weights in a checkpoint, loaded by the same in-process host the replay uses."""
    from rlkit.controller.worker_group import local_host
    from rlkit.trainer.replay.replay import _role_spec
    from rlkit.trainer.replay.step_record import load_record, recorded_steps

    record = load_record(record_dir / f"step_{recorded_steps(record_dir)[-1]}.pt")
    host = local_host({role: _role_spec(record.cfg, record, role)})
    host.call(role, "init_model", None)
    host.call(role, "load_checkpoint", None, str(checkpoint / role))
    return host._roles[role].model.full_state_dict()


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def _assert_replay_equals_run(result, keys: tuple[str, ...]) -> None:
    compared = {k: (replayed, logged) for k, replayed, logged in result.compared()}
    for key in keys:
        replayed, logged = compared[key]
        assert replayed == logged, f"{key}: replayed {replayed!r}, run logged {logged!r}"
    assert all(replayed == logged for replayed, logged in compared.values()), compared


def _grpo_replay(out: Path) -> str:
    from rlkit.trainer.replay.replay import replay_step

    started = time.perf_counter()
    result = replay_step(out / "ckpt", KILL_IN, say=lambda line: None)
    seconds = time.perf_counter() - started
    assert result.checkpoint == out / "ckpt" / "global_step_2" and result.steps == [3, 4]
    _assert_replay_equals_run(result, ("actor/pg_loss", "actor/grad_norm"))
    replayed = result.host._roles["actor"].model.full_state_dict()
    _assert_same_weights(replayed, _checkpoint_weights(out / "ckpt" / "global_step_4", out / "ckpt" / "steps", "actor"))

    # the rollout of step 4: the step-2 checkpoint, step 3's update, then step 4's generation with its seed
    rollout = replay_step(out / "ckpt", KILL_IN, role="rollout", say=lambda line: None)
    assert rollout.steps == [3]
    assert rollout.metrics["rollout/replayed_rows"] == 128 and rollout.metrics["rollout/rows_with_other_responses"] == 0
    return (f"[GRPO replay of steps 3-4: {seconds:.1f}s; pg_loss, grad_norm and {len(replayed)} weight tensors "
            "equal; step 4's rollout equal]")


def test_grpo_replay_equals_the_run_bit_for_bit(grpo):
    print(in_fresh_process(_grpo_replay, grpo["out"]))


def test_a_killed_actor_worker_restarts_from_the_last_checkpoint_and_the_run_repeats_exactly(grpo, toy_data,
                                                                                            tiny_model, tmp_path):
    """Also the determinism test: the same seed and config a second time give the same rows and weights."""
    killed: dict[str, float] = {}

    def kill_in_step_4(trainer) -> None:
        pid, metrics = trainer.workers.groups[0].pids[0], tmp_path / "logs" / "metrics.jsonl"

        def watch() -> None:
            while not metrics.exists() or not any(json.loads(line)["step"] == KILL_IN - 1
                                                  for line in metrics.read_text().splitlines() if line.strip()):
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)  # step 3 is logged: the worker dies in step 4
            killed["at"] = time.perf_counter()

        threading.Thread(target=watch, daemon=True).start()

    run = _run("grpo", _grpo_overrides(toy_data, tiny_model, tmp_path), tmp_path / "logs", during=kill_in_step_4)
    assert "at" in killed
    restarts = run["trainer"].restart_seconds
    assert len(restarts) == 1
    assert [r["step"] for r in run["rows"]] == list(range(1, STEPS + 1))  # each step once
    for first, second in zip(grpo["rows"], run["rows"]):
        same = {k: v for k, v in first.items() if not k.startswith(VARYING)}
        assert same == {k: v for k, v in second.items() if not k.startswith(VARYING)}, f"step {first['step']}"
    _assert_same_weights(run["state"], grpo["state"])
    print(f"[SIGKILL in step {KILL_IN}: workers restarted from global_step_2 in {restarts[0]:.1f}s; "
          f"{STEPS} steps logged once; rows and weights equal the uninterrupted run's]")


def test_breakpoint_in_the_replayed_update_stops_in_this_process(grpo):
    """A plain breakpoint() in update_actor (the test hook puts one there), then --break-at's pause, both
    driven over stdin: the replay is one process, so pdb simply works."""
    env = cli_env() | {"RLKIT_TEST_BREAKPOINT_IN": "actor.update_policy"}
    env.pop("PYTHONBREAKPOINT", None)
    # the hook's breakpoint() stops in the hook: two frames up is update_actor; --break-at stops in update_actor
    commands = "up\nup\np ('rank', self.rank, 'rows', len(batch))\nc\np ('again', len(batch))\nc\n"
    res = subprocess.run(rlkit_cmd("debug", "replay", str(grpo["out"] / "ckpt"), "--step", "3",
                                   "--break-at", "actor.update_policy"),
                         input=commands, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert out.count("(Pdb)") >= 2
    assert "('rank', 0, 'rows', 128)" in out  # the breakpoint() frame: the worker's update_actor, its batch
    assert "('again', 128)" in out  # --break-at: paused in maybe_break's caller, update_actor
    assert "pausing at phase 'actor.update_policy' (rank 0, step 3)" in res.stderr
    assert "actor/grad_norm" in out and "yes" in out  # the comparison table: replayed = logged


@pytest.fixture(scope="module")
def ppo(toy_data, tiny_model, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ppo")
    overrides = toy_overrides(toy_data, tiny_model, out, trainer__total_training_steps=3, trainer__save_freq=2,
                              trainer__debug__record_steps="[3]", critic__ppo_micro_batch_size_per_gpu=64)
    return {**_run("ppo", overrides, out / "logs"), "out": out}


def _ppo_replay(out: Path, role: str) -> None:
    from rlkit.trainer.replay.replay import replay_step

    result = replay_step(out / "ckpt", 3, role=role, say=lambda line: None)
    assert result.checkpoint == out / "ckpt" / "global_step_2" and result.steps == [3]
    _assert_replay_equals_run(result, (f"{role}/pg_loss" if role == "actor" else "critic/vf_loss",
                                       f"{role}/grad_norm"))
    replayed = result.host._roles[role].model.full_state_dict()
    _assert_same_weights(replayed, _checkpoint_weights(out / "ckpt" / "global_step_3", out / "ckpt" / "steps", role))


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_ppo_replay_equals_the_run_bit_for_bit(ppo, role):
    in_fresh_process(_ppo_replay, ppo["out"], role)
