"""Results a sandboxed harness reports back, which the program under test cannot forge.

The harness reads a random nonce from stdin before any untrusted code runs, then prints its
results as one line: nonce + JSON. The program never sees the nonce, so nothing it prints can
pass for the result line. `harness(body)` wraps a scorer's harness body (a `str.format`
template) with that protocol, a `_Timeout` exception and a SIGALRM handler raising it; the body
sets `_results`.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

_PRELUDE = r"""
import json as _json, signal as _signal, sys as _sys
_nonce = _sys.stdin.readline().strip()
class _Timeout(BaseException):
    pass
def _alarm(*_):
    raise _Timeout()
_signal.signal(_signal.SIGALRM, _alarm)
"""

_REPORT = r"""
_sys.__stdout__.write("\n" + _nonce + _json.dumps(_results) + "\n")
_sys.__stdout__.flush()
"""


def harness(body: str) -> str:
    """The full harness template: prelude + `body` + the result line (no braces added: format-safe)."""
    return _PRELUDE + body.strip("\n") + _REPORT


def new_nonce() -> str:
    return secrets.token_hex(16)


def read_report(stdout: str, nonce: str) -> Any | None:
    """The harness's results, or None when the run died before reporting (killed, crashed, exited)."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(nonce)), None)
    if line is None:
        return None
    try:
        return json.loads(line[len(nonce):])
    except ValueError:
        return None
