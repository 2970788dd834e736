"""Checkpoint directories: atomic publish, half-written dirs ignored, retention, latest pointer, resume modes."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from rlkit.errors import UserError
from rlkit.utils import checkpoint_io as ck


def save(root, step, keep_last=None, payload="w"):
    tmp = ck.begin_checkpoint(root, step)
    assert tmp.parent == root and tmp.name == f"global_step_{step}.tmp-{os.getpid()}"
    (tmp / "model.pt").write_text(payload)
    return ck.commit_checkpoint(root, tmp, step, keep_last=keep_last)


def names(root):
    return sorted(p.name for p in root.iterdir())


def test_commit_publishes_and_points_latest(tmp_path):
    final = save(tmp_path, 5)
    assert final == tmp_path / "global_step_5" and (final / ck.COMPLETE).is_file()
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
