"""Step records on disk: where they go, how `rlkit debug replay RUN --step N` finds them from what a user points at,
and the one-line errors when it cannot. (Replaying them is tests/trainer/test_replay_restart.py.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.step_record import StepRecorder, find_record, load_record


def _recorder(root: Path, steps: list[int]) -> StepRecorder:
    debug = SimpleNamespace(record_steps=steps)
    cfg = SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(root), debug=debug))
    return StepRecorder(cfg, "model", 10, str(root / "logs"), 1, lambda: [{"torch": [1, 2]}])


def _batch() -> Batch:
    return Batch({"advantages": torch.arange(6.0).view(3, 2)}, meta={"metrics": {"x": [1.0]}})


def test_an_asked_step_is_written_at_once_and_found_from_the_root_a_checkpoint_or_the_log_dir(tmp_path):
    rec = _recorder(tmp_path, [2])
    rec.start(1)
    rec.before_update(1, _batch())
    rec.start(2)
    rec.reordered(torch.tensor([2, 0, 1]))
    batch = _batch()
    rec.before_update(2, batch)
    batch["advantages"] = torch.zeros(3, 2)  # the update adds keys to the step's batch; the record keeps its own dict
    (tmp_path / "global_step_1").mkdir()
    (tmp_path / "logs").mkdir()
    for target in (tmp_path, tmp_path / "global_step_1", tmp_path / "logs"):
        path = find_record(target, 2)
        assert path == tmp_path / "steps" / "step_2.pt"
    record = load_record(path)
    assert record.step == 2 and record.rollout_order == [2, 0, 1] and record.worker_rng == [{"torch": [1, 2]}]
    assert torch.equal(record.batch["advantages"], torch.arange(6.0).view(3, 2)) and "metrics" not in record.batch.meta
    assert not (tmp_path / "steps" / "step_1.pt").exists()  # not asked, not failed: nothing written


def test_a_failed_step_is_written_without_being_asked(tmp_path):
    rec = _recorder(tmp_path, [])
    rec.start(3)
    assert rec.failed(3, RuntimeError("boom")) is None  # it failed before its batch was complete: nothing to save
    rec.before_update(3, _batch())
    path = rec.failed(3, RuntimeError("worker died\ndetails"))
    assert load_record(path).failure == "RuntimeError: worker died"


def test_errors_name_the_recorded_steps_and_the_fix(tmp_path):
    rec = _recorder(tmp_path, [4, 6])
    for step in (4, 6):
        rec.start(step)
        rec.before_update(step, _batch())
    with pytest.raises(UserError, match=r"step 5 was not recorded \(recorded: 4, 6\); rerun with "
                                        r"trainer.debug.record_steps=\[5\]"):
        find_record(tmp_path, 5)
    (tmp_path / "elsewhere" / "run").mkdir(parents=True)
    with pytest.raises(UserError, match="no step records here; run with trainer.debug.record_steps=\\[5\\]"):
        find_record(tmp_path / "elsewhere" / "run", 5)
    with pytest.raises(UserError, match="no such run, checkpoint or record"):
        find_record(tmp_path / "missing", 5)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a pickle")
    with pytest.raises(UserError, match="junk.pt: not a step record"):
        load_record(find_record(junk, 5))


def test_the_config_keys_are_checked_at_start_up():
    from rlkit.trainer.run_config import load_config

    cfg = load_config("grpo", ["trainer.debug.record_steps=[4,3,4]", "trainer.deterministic=true"])
    assert cfg.trainer.debug.record_steps == [3, 4] and cfg.trainer.max_worker_restarts == 3
    with pytest.raises(UserError, match=r"trainer.debug.record_steps: expected step numbers >= 1, got \[0\]"):
        load_config("grpo", ["trainer.debug.record_steps=[0]"])
    with pytest.raises(UserError, match="trainer.max_worker_restarts=-1 must be >= 0"):
        load_config("grpo", ["trainer.max_worker_restarts=-1"])
    # verl's per-role switch turns on the run-wide one
    assert load_config("grpo", ["actor_rollout_ref.actor.fsdp_config.full_determinism=true"]).trainer.deterministic
