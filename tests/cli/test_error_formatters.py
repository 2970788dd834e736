"""rlkit_cli.error_messages on real exceptions from real calls: each OSError kind, JSON, damaged
torch / DCP checkpoints; and what is not a user error (a bug) gets no message."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
import torch

from rlkit_cli.error_messages import describe_any


def raised(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the point is to capture what the library raises
        return exc
    raise AssertionError("did not raise")


def test_os_errors_name_the_path_and_the_fix(tmp_path):
    (tmp_path / "f").write_text("x")
    cases = {
        lambda: open(tmp_path),  # noqa: SIM115
        lambda: open(tmp_path / "f" / "x"),  # noqa: SIM115
        lambda: os.mkdir(tmp_path / "f"),
        lambda: open(tmp_path / "missing.txt"),  # noqa: SIM115
        lambda: os.rmdir(tmp_path),
        lambda: open(tmp_path / ("x" * 300)),  # noqa: SIM115
    }
    msgs = sorted(describe_any(raised(fn)) for fn in cases)
    assert f"{tmp_path}: is a directory; give the path of a file" in msgs
    assert f"{tmp_path}/f/x: not a directory; a part of the path is a file; check the path" in msgs
    assert f"{tmp_path}/f: file exists; remove it or choose another path" in msgs
    assert f"{tmp_path}/missing.txt: no such file or directory; check the path" in msgs
    assert f"{tmp_path}: directory not empty; empty it or choose another path" in msgs
    assert any(m.endswith("file name too long; use a shorter path") for m in msgs)


def test_a_write_error_without_a_file_name_finds_the_open_file():
    def write_full() -> None:
        with open("/dev/full", "w") as fh:
            fh.write("x")
            fh.flush()

    assert describe_any(raised(write_full)) == (
        "/dev/full: no space left on device; free some space or choose a path on another disk")


def test_json_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "a": 1,\n  "b": \n}\n')

    def load() -> object:
        with path.open() as fh:
            return json.load(fh)

    msg = describe_any(raised(load))
    assert msg.startswith(f"{path} line 4 column 1: not valid JSON (Expecting value)")


@pytest.mark.parametrize("size", [0, 100])
def test_damaged_torch_checkpoint_file(tmp_path, size):
    path = tmp_path / "trainer_state.pt"
    torch.save({"step": torch.ones(1000)}, path)
    os.truncate(path, size)
    msg = describe_any(raised(lambda: torch.load(path, weights_only=True)))
    assert msg.startswith(f"{path}: cannot load it (") and "damaged or incomplete" in msg
    assert "global_step_N" in msg


def test_damaged_dcp_shard_names_the_checkpoint_and_the_cause(tmp_path):
    import torch.distributed.checkpoint as dcp

    ckpt = tmp_path / "actor"
    dcp.save({"w": torch.ones(1000)}, checkpoint_id=str(ckpt), no_dist=True)
    for shard in ckpt.glob("*.distcp"):
        os.truncate(shard, 10)
    exc = raised(lambda: dcp.load({"w": torch.zeros(1000)}, checkpoint_id=str(ckpt), no_dist=True))
    assert not isinstance(exc, Exception)  # a BaseException: the CLI wrapper must catch those too
    msg = describe_any(exc)
    assert msg.startswith(f"{ckpt}: cannot load it (RuntimeError: PytorchStreamReader failed reading zip archive")


def test_bugs_get_no_message(tmp_path):
    assert describe_any(raised(lambda: {}["key"])) is None
    assert describe_any(raised(lambda: 1 / 0)) is None
    assert describe_any(raised(lambda: torch.ones(2) @ torch.ones(3))) is None  # a RuntimeError, not a file
    assert describe_any(raised(lambda: json.loads("{"))) == "JSON at line 1: not valid JSON (Expecting property name " \
        "enclosed in double quotes); fix the file, or re-create it (a model folder: download it again)"
