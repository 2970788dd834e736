"""Checkpoint directories: atomic publish, half-written dirs ignored, retention, latest pointer, resume modes."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from rlkit.errors import UserError
from rlkit.utils import checkpoint_io as ck
from rlkit.utils.checkpoint_verify import COMPLETE


def save(root, step, keep_last=None, payload="w"):
    tmp = ck.begin_checkpoint(root, step)
    assert tmp.parent == root and tmp.name == f"global_step_{step}.tmp-{os.getpid()}"
    (tmp / "model.pt").write_text(payload)
    return ck.commit_checkpoint(root, tmp, step, keep_last=keep_last)


def names(root):
    return sorted(p.name for p in root.iterdir())


def test_commit_publishes_and_points_latest(tmp_path):
    final = save(tmp_path, 5)
    assert final == tmp_path / "global_step_5" and (final / COMPLETE).is_file()
    assert (tmp_path / ck.LATEST).read_text().strip() == "5"
    assert names(tmp_path) == ["global_step_5", ck.LATEST]
    assert ck.find_latest_checkpoint(tmp_path) == final


def test_half_written_dirs_are_ignored(tmp_path):
    save(tmp_path, 1)
    ck.begin_checkpoint(tmp_path, 2)  # crashed while writing step 2 (still a temp dir)
    (tmp_path / "global_step_3").mkdir()  # renamed by hand/other tool, but never marked complete
    assert ck.find_latest_checkpoint(tmp_path) == tmp_path / "global_step_1"
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [1]


def test_pointer_to_missing_dir_falls_back_to_scan(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 2)
    (tmp_path / ck.LATEST).write_text("7\n")
    assert ck.find_latest_checkpoint(tmp_path) == tmp_path / "global_step_2"
    (tmp_path / ck.LATEST).write_text("garbage")
    assert ck.find_latest_checkpoint(tmp_path) == tmp_path / "global_step_2"


def test_retention_keeps_last_k(tmp_path):
    for step in range(1, 6):
        save(tmp_path, step, keep_last=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [4, 5]
    assert not [n for n in names(tmp_path) if ".del-" in n or ".tmp-" in n]


def test_retention_never_deletes_the_newest(tmp_path):
    for step in (10, 20):
        save(tmp_path, step)
    newest = save(tmp_path, 12, keep_last=1)  # resumed from an older step and saved again
    assert newest.is_dir() and ck.find_latest_checkpoint(tmp_path) == newest
    assert (tmp_path / ck.LATEST).read_text().strip() == "12"


def test_recommit_same_step_replaces(tmp_path):
    save(tmp_path, 3, payload="old")
    final = save(tmp_path, 3, payload="new")
    assert (final / "model.pt").read_text() == "new"
    assert names(tmp_path) == ["global_step_3", ck.LATEST]


def test_stale_temp_dir_of_dead_process_is_removed(tmp_path):
    stale = tmp_path / "global_step_9.tmp-999999999"
    stale.mkdir(parents=True)
    save(tmp_path, 1)
    assert not stale.exists()


def test_bad_arguments(tmp_path):
    tmp = ck.begin_checkpoint(tmp_path, 1)
    with pytest.raises(UserError, match="keep_last must be >= 1"):
        ck.commit_checkpoint(tmp_path, tmp, 1, keep_last=0)
    with pytest.raises(UserError, match="not a checkpoint temp dir"):
        ck.commit_checkpoint(tmp_path, tmp_path / "elsewhere", 1)
    with pytest.raises(UserError, match="step must be >= 0"):
        ck.begin_checkpoint(tmp_path, -1)


def test_resume_modes(tmp_path):
    assert ck.resolve_resume(tmp_path, "auto") is None  # nothing yet: fresh start
    save(tmp_path, 1)
    latest = save(tmp_path, 2)
    assert ck.resolve_resume(tmp_path, "auto") == latest
    assert ck.resolve_resume(tmp_path, "disable") is None
    assert ck.resolve_resume(tmp_path, str(tmp_path / "global_step_1")) == tmp_path / "global_step_1"
    assert ck.resolve_resume(tmp_path / "other", tmp_path) == latest  # a root: its latest
    with pytest.raises(UserError, match="does not exist"):
        ck.resolve_resume(tmp_path, str(tmp_path / "global_step_99"))
    (tmp_path / "global_step_3").mkdir()
    with pytest.raises(UserError, match=r"no COMPLETE marker.*global_step_1, global_step_2"):
        ck.resolve_resume(tmp_path, tmp_path / "global_step_3")
    (tmp_path / "weights").mkdir()
    with pytest.raises(UserError, match="neither a global_step_N folder"):
        ck.resolve_resume(tmp_path, tmp_path / "weights")


def draw():
    import random

    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def test_rng_round_trip(tmp_path):
    torch.manual_seed(1)
    np.random.seed(1)
    state = ck.save_rng_state()
    expected = draw()
    draw()
    restored = pickle.loads(pickle.dumps(state))
    ck.load_rng_state(restored)
    assert draw() == expected
    torch.save(state, tmp_path / "rng.pt")  # builtin types only: loads with weights_only=True
    ck.load_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draw() == expected


# ------------------------------------------------------------------ verification, rotation and fallback


def save_dcp(root, step, keep_last=None):
    """A checkpoint shaped like the trainer's: a real DCP actor folder plus trainer_state.pt."""
    import warnings

    import torch.distributed.checkpoint as dcp

    tmp = ck.begin_checkpoint(root, step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": {"w": torch.full((4, 4), float(step))}}, checkpoint_id=str(tmp / "actor"))
    torch.save({"global_step": step}, tmp / "trainer_state.pt")
    return ck.commit_checkpoint(root, tmp, step, keep_last=keep_last, required=["trainer_state.pt", "actor/.metadata"])


def load_dcp(path):
    """What resuming does with a checkpoint: read the DCP shards and the trainer state; returns the step."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.zeros(4, 4)}}
    dcp.load(state, checkpoint_id=str(path / "actor"), no_dist=True)
    step = int(torch.load(path / "trainer_state.pt")["global_step"])
    assert float(state["model"]["w"][0, 0]) == step
    return step


def test_marker_lists_every_file_and_a_deleted_shard_breaks_the_checkpoint(tmp_path):
    good = save_dcp(tmp_path, 5)
    marker = json.loads((good / COMPLETE).read_text())
    assert set(marker["files"]) == {"actor/.metadata", "actor/__0_0.distcp", "trainer_state.pt"}
    (good / "actor" / "__0_0.distcp").unlink()
    assert not ck.is_complete(good)
    assert ck.broken_checkpoints(tmp_path) == [(5, good, "actor/__0_0.distcp is missing (listed in COMPLETE)")]
    with pytest.raises(UserError, match=r"rlkit export: .*global_step_5 actor/__0_0.distcp is missing"):
        ck.open_checkpoint(good, "rlkit export")


def test_a_truncated_file_breaks_the_checkpoint(tmp_path):
    good = save_dcp(tmp_path, 1)
    (good / "trainer_state.pt").write_bytes(b"x")
    assert ck.checkpoint_problem(good).startswith("trainer_state.pt has 1 bytes, COMPLETE recorded")


def test_commit_refuses_an_incomplete_checkpoint_and_rotates_nothing(tmp_path):
    import torch.distributed.checkpoint as dcp

    first = save_dcp(tmp_path, 1, keep_last=1)
    tmp = ck.begin_checkpoint(tmp_path, 2)
    dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(tmp / "actor"))
    (tmp / "actor" / "__0_0.distcp").unlink()  # a rank's shard never arrived
    with pytest.raises(ck.CheckpointError, match=r"step 2 .* incomplete \(trainer_state.pt is missing; "
                       r"actor/__0_0.distcp is missing\).*no older checkpoint was deleted"):
        ck.commit_checkpoint(tmp_path, tmp, 2, keep_last=1, required=["trainer_state.pt"])
    assert ck.list_checkpoints(tmp_path) == [(1, first)]
    assert not (tmp_path / "global_step_2").exists()
    assert (tmp_path / ck.LATEST).read_text().strip() == "1"


def test_rotation_never_keeps_a_broken_checkpoint_in_place_of_a_good_one(tmp_path):
    """The issue's repro: resume from step 5 after a shard of step 10 was deleted, then save step 7."""
    five = save_dcp(tmp_path, 5, keep_last=2)
    ten = save_dcp(tmp_path, 10, keep_last=2)
    (ten / "actor" / "__0_0.distcp").unlink()
    said = []
    assert ck.load_with_fallback(tmp_path, str(five), load_dcp, said.append) == five and said == []
    seven = save_dcp(tmp_path, 7, keep_last=2)
    assert ck.list_checkpoints(tmp_path) == [(5, five), (7, seven)]  # the broken one took no slot
    assert ten.is_dir()  # and was not deleted either (its files may be repairable)
    save_dcp(tmp_path, 8, keep_last=1)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [8]
    assert ck.find_latest_checkpoint(tmp_path) == tmp_path / "global_step_8"


def test_auto_resume_skips_a_broken_latest_and_says_so(tmp_path):
    five = save_dcp(tmp_path, 5)
    ten = save_dcp(tmp_path, 10)
    (ten / "actor" / "__0_0.distcp").unlink()
    said, loaded = [], []
    assert ck.load_with_fallback(tmp_path, "auto", lambda p: loaded.append(load_dcp(p)), said.append) == five
    assert loaded == [5]
    assert said == [f"trainer.resume_mode=auto: skipping {ten}: actor/__0_0.distcp is missing (listed in COMPLETE)",
                    f"trainer.resume_mode=auto: fell back to the previous complete checkpoint {five}"]


def test_auto_resume_falls_back_when_loading_fails_and_marks_the_failure(tmp_path):
    five = save_dcp(tmp_path, 5)
    ten = save_dcp(tmp_path, 10)
    with open(ten / "actor" / "__0_0.distcp", "r+b") as f:  # same size, garbage bytes: only loading finds out
        f.write(b"\0" * 64)
    said = []
    assert ck.load_with_fallback(tmp_path, "auto", load_dcp, said.append) == five
    assert said[0].startswith(f"trainer.resume_mode=auto: cannot load {ten} (")
    assert said[-1] == f"trainer.resume_mode=auto: fell back to the previous complete checkpoint {five}"
    assert ck.checkpoint_problem(ten).startswith("failed to load before (")
    assert ck.find_latest_checkpoint(tmp_path) == five  # and rotation now counts it out
    seven = save_dcp(tmp_path, 7, keep_last=1)
    assert ck.list_checkpoints(tmp_path) == [(7, seven)] and ten.is_dir()


def test_auto_resume_with_nothing_loadable_is_an_error_not_a_fresh_start(tmp_path):
    one = save_dcp(tmp_path, 1)
    (one / "trainer_state.pt").unlink()
    with pytest.raises(ck.CheckpointError, match=r"no checkpoint in .* loads: global_step_1 \(trainer_state.pt "
                       r"is missing.*trainer.resume_mode=disable"):
        ck.load_with_fallback(tmp_path, "auto", load_dcp, print)
    assert ck.load_with_fallback(tmp_path / "empty", "auto", load_dcp, print) is None  # a first run starts fresh
    assert ck.load_with_fallback(tmp_path, "disable", load_dcp, print) is None


def test_explicit_resume_that_fails_to_load_names_the_checkpoint(tmp_path):
    one = save_dcp(tmp_path, 1)
    with open(one / "actor" / "__0_0.distcp", "r+b") as f:
        f.write(b"\0" * 64)
    with pytest.raises(ck.CheckpointError, match=rf"trainer.resume_mode: cannot load {one} \(.*\); pick another"):
        ck.load_with_fallback(tmp_path, str(one), load_dcp, print)
