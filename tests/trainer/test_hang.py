"""A hang is named, not waited out (trainer.hang_timeout_s, rlkit/trainer/run/hang_watch.py): a real run whose rank 1
waits in an all-reduce that rank 0 never joins stops within the limit, naming the group, the rank, the collective
and where it was called, with every process's stack in the log dir and the resume line; and the watch's rules
(limits from the phase's history, what a stack says a worker waits in) on their own."""

from __future__ import annotations

import importlib
import sys
import time

import pytest

from rlkit.debug.stacks import Proc
from rlkit.trainer.run.hang_watch import HangStopped, HangWatch, classify
from tests.trainer.conftest import fit, toy_overrides

PLUGIN = "tests.trainer.hang_plugin"
ALL_REDUCE = [
    "main_loop (ray/_private/worker.py:900)",
    "_WorkerHost.call (rlkit/controller/worker_group.py:98)",
    "ActorWorker.update_actor (rlkit/workers/actor.py:120)",
    "hang_at_step (tests/trainer/hang_plugin.py:22)",
    "_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:81)",
    "all_reduce (torch/distributed/distributed_c10d.py:2806)",
]


def test_limit_follows_the_phase_history():
    watch = HangWatch(10.0)
    assert watch.limit("gen") == 20.0  # never finished: twice the floor
    watch.slowest["gen"] = 1.0
    assert watch.limit("gen") == 10.0  # fast so far: the floor
    watch.slowest["gen"] = 8.0
    assert watch.limit("gen") == 40.0  # slow phase: 5 x its slowest
    assert HangWatch(None).limit("gen") == 0.0 and not HangWatch(0).enabled


def test_phases_record_their_slowest_time_and_an_open_one_goes_overdue():
    watch = HangWatch(0.05)
    with watch.phase("adv"):
        time.sleep(0.02)
    assert 0.02 <= watch.slowest["adv"] < 1.0
    assert watch.overdue() is None
    with watch.phase("update_actor"):
        time.sleep(0.15)  # first run: its limit is 2 x 0.05 s
        late = watch.overdue()
    assert late is not None and late[0].name == "update_actor" and late[2] == pytest.approx(0.1)


def test_a_stack_names_the_collective_the_engine_call_or_idleness():
    waiting = classify(Proc(7, "actor rank 1", 1, frames=ALL_REDUCE))
    assert (waiting.kind, waiting.where) == ("collective", "all_reduce (torch/distributed/distributed_c10d.py:2806)")
    assert waiting.called_from == "ActorWorker.update_actor (rlkit/workers/actor.py:120)"
    assert "waits in collective all_reduce" in waiting.line()
    engine = classify(Proc(8, "rollout rank 0", 0, frames=[
        "VLLMRollout.generate (rlkit/rollout/vllm_rollout.py:260)", "LLM.generate (vllm/entrypoints/llm.py:400)",
        "LLM._run_engine (vllm/entrypoints/llm.py:1500)"]))
    assert (engine.kind, engine.where) == ("engine call", "LLM.generate (vllm/entrypoints/llm.py:400)")
    idle = classify(Proc(9, "actor rank 0", 0, frames=["main_loop (ray/_private/worker.py:900)"]))
    assert idle.kind == "idle" and idle.line() == "actor rank 0: idle (no call in progress)"
    assert classify(Proc(10, "x", 0, error="py-spy took more than 10s")).kind == "unreadable"


@pytest.fixture
def hang_plugin():
    sys.modules.pop(PLUGIN, None)
    module = importlib.import_module(PLUGIN)
    yield module
    module.unregister()
    sys.modules.pop(PLUGIN, None)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rank_waiting_in_an_all_reduce_is_named_and_the_run_stops(hang_plugin, toy_data, tiny_model, tmp_path):
    overrides = toy_overrides(
        toy_data, tiny_model, tmp_path, trainer__n_gpus_per_node=2, trainer__total_training_steps=4,
        trainer__save_freq=1, trainer__hang_timeout_s=20, trainer__plugins=f"[{PLUGIN}]",
        actor_rollout_ref__actor__policy_loss=hang_plugin.LOSS,
    )
    began = time.monotonic()
    with pytest.raises(HangStopped) as info:
        fit("grpo", overrides, tmp_path / "logs")
    waited = time.monotonic() - began
    stop = info.value
    report = stop.report
    assert report.step == hang_plugin.HANG_STEP and report.phase == "update_actor"
    assert report.limit_s >= 20 and report.seconds <= report.limit_s + 10 and waited < 400
    by_rank = {w.rank: w for w in report.waiters}
    assert by_rank[1].kind == "collective" and by_rank[1].where.startswith("all_reduce ("), by_rank[1]
    assert "hang_plugin.py" in by_rank[1].called_from or "rlkit/" in by_rank[1].called_from
    assert by_rank[0].kind == "in" and "never_join" in by_rank[0].where, by_rank[0]
    line = stop.line(["rlkit", "train", "grpo", "trainer.save_freq=1"])
    assert line.startswith(f"hang: step {hang_plugin.HANG_STEP} made no progress in phase 'update_actor'")
    assert "rank 1" in line and "waits in collective all_reduce" in line
    assert str(tmp_path / "ckpt" / "global_step_1") in line  # the last complete checkpoint, step 1's
    assert line.endswith("resume with: rlkit train grpo trainer.save_freq=1 trainer.resume_mode=auto")
    text = (tmp_path / "logs" / f"hang_step{hang_plugin.HANG_STEP}.txt").read_text()
    assert "== driver pid" in text and "all_reduce (torch/distributed" in text and "never_join" in text
