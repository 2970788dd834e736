"""A skipped test is a failed run unless its reason is listed in tests/allowed_skips.txt.

A test that skips on a fresh clone (a missing file, an optional package, a machine
capability) silently stops testing what it claims to test. This plugin collects every
skip (at collection or at run time), matches its reason against the allow-list (one
regular expression per line, `re.search`, `#` comments), and turns the exit status into
"tests failed" when one is not listed. Expected failures (xfail) are not skips.

Loaded by tests/conftest.py. `RLKIT_ALLOWED_SKIPS=FILE` points at another list (used by
the guard's own tests).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

DEFAULT_LIST = Path(__file__).with_name("allowed_skips.txt")
_unlisted: list[tuple[str, str]] = []  # (test id, reason)


def allowed_patterns(path: Path | None = None) -> list[re.Pattern[str]]:
    """The compiled regexes of the allow-list; a missing file means none are allowed."""
    path = path or Path(os.environ.get("RLKIT_ALLOWED_SKIPS") or DEFAULT_LIST)
    if not path.is_file():
        return []
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    return [re.compile(ln) for ln in lines if ln and not ln.startswith("#")]


def skip_reason(report: Any) -> str | None:
    """The reason of a skipped report ("Skipped: " stripped), or None when it is not a skip."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _record(report: Any) -> None:
    reason = skip_reason(report)
    if reason is None:
        return
    if not any(p.search(reason) for p in allowed_patterns()):
        _unlisted.append((report.nodeid, reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)  # module-level skip / importorskip


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _unlisted:
        return
    tr = terminalreporter
    tr.section("skips not in tests/allowed_skips.txt", sep="=", red=True, bold=True)
    for nodeid, reason in _unlisted:
        tr.line(f"{nodeid}: {reason}")
    tr.line("Make the test run here (ship the file, install the package), or add a regex for the "
            "reason to tests/allowed_skips.txt with a comment saying why it is legitimate.")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unlisted and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
