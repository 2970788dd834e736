"""The skip guard (tests/skip_guard.py): a skip whose reason is not allow-listed fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.skip_guard import DEFAULT_LIST, allowed_patterns

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
import pytest

def test_ok():
    assert True

def test_skips():
    pytest.skip("machine lacks the frobnicator")

@pytest.mark.xfail(reason="known bug", strict=True)
def test_xfail():
    assert False
'''
MODULE_SKIP = 'import pytest\npytest.importorskip("no_such_module_rlkit_xyz")\n\ndef test_never():\n    pass\n'


def _run(tmp_path: Path, allow: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_a.py").write_text(TESTS)
    (tmp_path / "test_b.py").write_text(MODULE_SKIP)
    allow_file = tmp_path / "allowed.txt"
    allow_file.write_text(allow)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLKIT_ALLOWED_SKIPS": str(allow_file)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.skip_guard", "-p", "no:cacheprovider", "-q",
         f"--rootdir={tmp_path}", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


def test_unlisted_skips_fail_the_run(tmp_path):
    proc = _run(tmp_path, "# nothing allowed\n")
    assert proc.returncode == 1, proc.stdout
    assert "skips not in tests/allowed_skips.txt" in proc.stdout
    assert "test_a.py::test_skips: machine lacks the frobnicator" in proc.stdout
    assert "test_b.py: could not import 'no_such_module_rlkit_xyz'" in proc.stdout
    assert "known bug" not in proc.stdout.split("skips not in")[1]  # an xfail is not a skip


def test_listed_skips_pass(tmp_path):
    proc = _run(tmp_path, "# why: comment lines are ignored\nlacks the frobnicator$\nno_such_module_rlkit\n")
    assert proc.returncode == 0, proc.stdout
    assert "skips not in" not in proc.stdout


def test_one_unlisted_skip_among_listed_ones_still_fails(tmp_path):
    proc = _run(tmp_path, "frobnicator\n")
    assert proc.returncode == 1, proc.stdout
    assert "no_such_module_rlkit_xyz" in proc.stdout and "test_a.py::test_skips" not in proc.stdout


def test_the_repository_list_is_valid_and_documented():
    text = DEFAULT_LIST.read_text(encoding="utf-8")
    assert text.startswith("#")  # the header says what the file is
    patterns = allowed_patterns(DEFAULT_LIST)  # every entry compiles
    lines = text.splitlines()
    for i, line in enumerate(lines):  # every entry has a comment right above it saying why
        if line.strip() and not line.startswith("#"):
            assert lines[i - 1].startswith("#"), f"allowed_skips.txt line {i + 1} has no comment above it"
    assert len(patterns) == sum(1 for ln in lines if ln.strip() and not ln.startswith("#"))
