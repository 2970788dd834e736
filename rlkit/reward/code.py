"""`code` scorer: run the model's Python program against tests in the sandbox.

Two test formats, read from `extra_info` (keys at top level) or from the ground
truth (a JSON string or dict):

* `{"tests": ["assert f(1) == 2", ...]}`: rlkit.sandbox.code_judge runs the program and the
  asserts in two separate sandboxed processes (each assert with its own time limit); the
  asserts see the program's results as plain data only, so the program cannot forge a pass;
* `{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}`: one sandboxed run per
  case, stdin in; this process compares stdout line by line (trailing whitespace ignored).

Score = fraction of checks passed. `error` is the first failure's kind (rlkit.sandbox.code_judge.KINDS:
ok / wrong_answer / runtime_error / timeout / memory / syntax_error / output_limit / exited /
protocol_error / opaque_value / unsupported_value). Threat model: docs/rewards.md.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from rlkit.errors import UserError
from rlkit.reward.registry import SCORERS
from rlkit.sandbox import JudgeLimits, SandboxJob, SandboxLimits, judge, run_many

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_PY_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(response: str) -> str:
    """The last ```python fenced block (else the last plain ``` block, else the whole text)."""
    blocks = _PY_FENCE.findall(response) or _FENCE.findall(response)
    return blocks[-1] if blocks else response


def load_tests(ground_truth: Any, extra_info: Mapping | None) -> dict:
    """Tests from extra_info (preferred) or the ground truth; a clear error when there are none."""
    if isinstance(extra_info, Mapping) and ("tests" in extra_info or "inputs" in extra_info):
        spec: Any = extra_info
    else:
        spec = ground_truth
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError:
                raise UserError(
                    "code scorer: ground_truth is not JSON tests ({'tests': [...]} or inputs/outputs)"
                ) from None
    if isinstance(spec, Mapping) and "tests" in spec:
        return {"tests": [str(t) for t in spec["tests"]]}
    if isinstance(spec, Mapping) and "inputs" in spec and "outputs" in spec:
        if len(spec["inputs"]) != len(spec["outputs"]):
            raise UserError("code scorer: 'inputs' and 'outputs' have different lengths")
        return {"inputs": [str(x) for x in spec["inputs"]], "outputs": [str(x) for x in spec["outputs"]]}
    raise UserError("code scorer: no tests found; give {'tests': [...]} or {'inputs': [...], 'outputs': [...]}")


def _same_output(got: str, want: str) -> bool:
    norm = lambda s: [line.rstrip() for line in s.strip().splitlines()]
    return norm(got) == norm(want)


def _first_failure(kinds: list[str]) -> str:
    return next((k for k in kinds if k != "ok"), "ok")


def _run_asserts(code: str, tests: list[str], limits: JudgeLimits) -> list[str]:
    """The judge's verdict per assert: the program and the asserts run in separate processes."""
    return judge([code], tests, limits).kinds[0]


def _run_io(code: str, spec: dict, limits: SandboxLimits, workers: int, total_s: float) -> list[str]:
    """One sandboxed run per case, `workers` at a time; cases left after `total_s` count as timeouts."""
    deadline = time.monotonic() + total_s
    kinds: list[str] = []
    cases = list(zip(spec["inputs"], spec["outputs"]))
    for i in range(0, len(cases), workers):
        chunk = cases[i : i + workers]
        if time.monotonic() >= deadline:
            kinds += ["timeout"] * len(chunk)
            continue
        results = run_many([SandboxJob(code, stdin, limits) for stdin, _ in chunk], max_workers=workers)
        for res, (_, want) in zip(results, chunk):
            if res.status != "ok":
                kinds.append(res.status)
            else:
                kinds.append("ok" if _same_output(res.stdout, want) else "wrong_answer")
    return kinds


@SCORERS.register("code")
def code_score(
    response: str,
    ground_truth: Any,
    extra_info: Mapping | None = None,
    *,
    timeout_s: float = 3.0,
    total_timeout_s: float = 8.0,
    memory_mb: int = 1024,
    workers: int = 1,
    **_: Any,
) -> dict:
    """Pass fraction of the program extracted from `response` on the row's tests.

    `timeout_s` bounds each check, `total_timeout_s` the whole sample; keep the latter
    below the RewardManager's per-sample timeout (10 s by default).
    """
    tests = load_tests(ground_truth, extra_info)
    code = extract_code(response)
    if "tests" in tests:
        total = min(timeout_s * (len(tests["tests"]) + 1), total_timeout_s)
        # the dataset's tests are trusted: their tester process may be reused across samples
        limits = JudgeLimits(test_s=timeout_s, total_s=total, memory_mb=memory_mb, reuse_tester=True)
        kinds = _run_asserts(code, tests["tests"], limits)
    else:
        limits = SandboxLimits(wall_s=timeout_s, memory_mb=memory_mb)
        kinds = _run_io(code, tests, limits, max(1, workers), total_timeout_s)
    passed = sum(k == "ok" for k in kinds)
    return {
        "score": passed / len(kinds) if kinds else 0.0,
        "error": _first_failure(kinds),
        "passed": passed,
        "total": len(kinds),
    }
