"""Step records on disk: where they go, how `rlkit debug replay RUN --step N` finds them from what a user points at,
and the one-line errors when it cannot. (Replaying them is tests/trainer/test_replay_restart.py.)"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.replay.step_record import StepRecorder, find_record, load_record


def _recorder(root: Path, steps: list[int], save_freq: int = 1) -> StepRecorder:
    debug = SimpleNamespace(record_steps=steps)
    cfg = SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(root), debug=debug, save_freq=save_freq))
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
    from rlkit.trainer.run.run_config import load_config

    cfg = load_config("grpo", ["trainer.debug.record_steps=[4,3,4]", "trainer.deterministic=true"])
    assert cfg.trainer.debug.record_steps == [3, 4] and cfg.trainer.max_worker_restarts == 3
    with pytest.raises(UserError, match=r"trainer.debug.record_steps: expected step numbers >= 1, got \[0\]"):
        load_config("grpo", ["trainer.debug.record_steps=[0]"])
    with pytest.raises(UserError, match="trainer.max_worker_restarts=-1 must be >= 0"):
        load_config("grpo", ["trainer.max_worker_restarts=-1"])
    # verl's per-role switch turns on the run-wide one
    assert load_config("grpo", ["actor_rollout_ref.actor.fsdp_config.full_determinism=true"]).trainer.deterministic


def _save(root: Path, step: int, keep_last: int) -> None:
    from rlkit.utils import checkpoint_io as ck

    tmp = ck.begin_checkpoint(root, step)
    (tmp / "trainer_state.pt").write_bytes(b"x")
    ck.commit_checkpoint(root, tmp, step, keep_last=keep_last, required=["trainer_state.pt"])


def test_the_checkpoint_a_recorded_step_replays_from_stays_out_of_the_rotation(tmp_path):
    """The reported case: save_freq=1, record_steps=[2], 4 steps, 2 checkpoints kept: step 1's checkpoint, which
    step 2's replay starts from, used to be rotated away; now it stays, beside the newest two."""
    from rlkit.utils.checkpoint_io import list_checkpoints

    rec = _recorder(tmp_path, [2])
    for step in range(1, 5):
        rec.start(step)
        rec.before_update(step, _batch())  # the record is written before the step's checkpoint
        _save(tmp_path, step, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 3, 4]
    plain = tmp_path / "plain"  # without a record the rotation is unchanged
    for step in range(1, 5):
        _save(plain, step, keep_last=2)
    assert [s for s, _ in list_checkpoints(plain)] == [3, 4]


def test_the_steps_between_the_checkpoint_and_a_recorded_step_are_recorded_too(tmp_path):
    from rlkit.trainer.replay.step_record import recorded_steps, steps_to_record

    assert steps_to_record([2], 1) == {2}
    assert steps_to_record([7], 5) == {6, 7} and steps_to_record([5, 10], 5) == {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
    assert steps_to_record([3], -1) == {1, 2, 3}  # no checkpoint before the end: the replay starts from the weights
    rec = _recorder(tmp_path, [7], save_freq=5)
    for step in range(1, 8):
        rec.start(step)
        rec.before_update(step, _batch())
    assert recorded_steps(tmp_path / "steps") == [6, 7]


def test_replay_errors_never_advise_what_the_run_did(tmp_path):
    """A run recorded before the rotation kept the checkpoint (save_freq=1 and 2 kept): the error names the removed
    checkpoint and the one fix, not `save_freq=1`, which the run had."""
    from rlkit.trainer.replay.replay import _check_base_kept, _record_of
    from rlkit.trainer.replay.step_record import StepRecord

    trainer = SimpleNamespace(save_freq=1, max_actor_ckpt_to_keep=2)
    record = StepRecord(2, _batch(), SimpleNamespace(trainer=trainer), "model", 4, str(tmp_path), str(tmp_path))
    with pytest.raises(UserError, match=r"^step 2 replays from the checkpoint of step 1, which this run's rotation "
                                        r"removed \(trainer.max_actor_ckpt_to_keep=2\); .* record it again with "
                                        r"trainer.debug.record_steps=\[2\]$") as err:
        _check_base_kept(record, 0)
    assert "save_freq" not in str(err.value)
    _check_base_kept(record, 1)  # the checkpoint is there: nothing to say
    record.step = 3
    with pytest.raises(UserError, match=r"^step 3 replays from the initial weights through the steps since, and step 1 "
                                        r"has no record \(this run recorded steps none\);") as err:
        _record_of(record, 1, None)
    assert "save_freq" not in str(err.value)
