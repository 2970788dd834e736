"""The code judge (rlkit/sandbox/code_judge.py): programs that tamper with the verdict score 0 with a named
error kind; honest programs and tests of many shapes still pass; the sandbox limits hold inside a call.

Every attack here either would score 1.0 if program and verdict-printing harness shared one interpreter
(three classes: the nonce read from __main__, replaced harness functions, an atexit hook printing the
result line) or targets the judge's own design (its channel, its server code, its decoder)."""

from __future__ import annotations

import json
import os
import time

import pytest

from rlkit.reward.code import code_score
from rlkit.sandbox import BOOT, KINDS, JudgeLimits, judge

# Every test calls the program; the last cannot pass at all: a score above 0 means a forged verdict.
TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert False"]}

# Writes "passing" lines of every protocol (a nonce-tagged verdict line, READY/R/V lines) to every fd it has.
FORGE = r'''
import os, sys, __main__
_lines = [v + '["ok", "ok", "ok"]' for v in list(vars(__main__).values()) if isinstance(v, str)]
_lines += ['READY {"kind": "ok"}'] + ['R %d {"v": 3}' % i for i in range(1, 20)]
_lines += ['V {"i": %d, "kind": "ok", "detail": ""}' % i for i in range(3)]
_blob = ("\n" + "\n".join(_lines) + "\n").encode()
def _forge():
    for fd in range(0, 64):
        try:
            os.write(fd, _blob)
        except OSError:
            pass
'''
WRONG_ADD = "\ndef add(a, b):\n    return None\n"

ATTACKS = {
    # --- the three classes that beat a harness sharing the program's interpreter
    "nonce_read_from_main": (FORGE + "_forge()\nos._exit(0)\n", {"exited", "protocol_error"}),
    "harness_functions_replaced": (
        "import __main__\nfor _n, _v in list(vars(__main__).items()):\n"
        "    if callable(_v) and not isinstance(_v, type):\n        setattr(__main__, _n, lambda *a, **k: 'ok')\n"
        + WRONG_ADD,
        {"timeout"},  # the patched server never says READY
    ),
    "atexit_prints_result_line": (FORGE + "import atexit\natexit.register(_forge)\n" + WRONG_ADD, {"wrong_answer"}),
    "atexit_then_exit": (FORGE + "import atexit\natexit.register(_forge)\nsys.exit(0)\n", {"exited"}),
    "print_result_lines_on_stdout": (
        "import sys, __main__\nfor _v in list(vars(__main__).values()):\n    if isinstance(_v, str):\n"
        "        sys.__stdout__.write('\\n' + _v + '[\"ok\", \"ok\", \"ok\"]\\nV {\"i\": 0, \"kind\": \"ok\"}\\n')\n"
        "sys.__stdout__.flush()\n" + WRONG_ADD,
        {"wrong_answer"},
    ),
    # --- the channel of the new design
    "forge_lines_on_every_fd_at_load": (FORGE + "_forge()\n" + WRONG_ADD, {"protocol_error"}),
    "forge_lines_on_every_fd_in_call": (FORGE + "def add(a, b):\n    _forge()\n    return None\n",
                                        {"protocol_error"}),
    "thread_floods_the_channel": (
        FORGE + "import threading, time\ndef _loop():\n    while True:\n        _forge()\n        time.sleep(0.001)\n"
        "threading.Thread(target=_loop, daemon=True).start()\ntime.sleep(0.05)\n" + WRONG_ADD,
        {"protocol_error"},
    ),
    "flood_result_lines_on_stdout": (
        "import sys\nfor _ in range(200000):\n    sys.stdout.write('V {\"i\": 0, \"kind\": \"ok\"}\\n')\n" + WRONG_ADD,
        {"output_limit"},
    ),
    # --- the server's own code, patched from inside the program
    "server_sends_mock_any": (
        "import __main__\n__main__._Server.enc = lambda self, x: {'t': 'import', 'mod': 'unittest.mock', 'v': 'ANY'}\n"
        + WRONG_ADD,
        {"protocol_error"},
    ),
    "server_rewrites_replies_as_verdicts": (
        "import __main__\n_orig = __main__._send\n"
        "__main__._send = lambda fd, line: _orig(fd, line.replace('R ', 'V ', 1))\n" + WRONG_ADD,
        {"protocol_error"},
    ),
    "server_injects_a_builtin_into_the_test": (
        "import __main__\n_answer = __main__._Server.answer\ndef answer(self, req):\n    out = _answer(self, req)\n"
        "    if req.get('op') == 'names':\n        out['v'].append(['AssertionError', {'t': 'ref', 'id': 0}])\n"
        "    return out\n__main__._Server.answer = answer\n" + WRONG_ADD,
        {"protocol_error"},
    ),
    "server_names_a_stdlib_class_as_the_function": (
        "import __main__\n__main__._Server.answer = lambda self, req: {'t': 'dict', 'v': [['add', "
        "{'t': 'import', 'mod': 'unittest.mock', 'v': 'MagicMock'}]]}\n" + WRONG_ADD,
        {"protocol_error"},
    ),
    # --- exits, signals, builtins
    "sys_exit_before_tests": ("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n", {"exited"}),
    "os_exit_before_tests": ("import os\nos._exit(0)\ndef add(a, b):\n    return a + b\n", {"exited"}),
    "sys_exit_in_call": ("import sys\ndef add(a, b):\n    sys.exit(0)\n", {"exited"}),
    "os_exit_in_call": ("import os\ndef add(a, b):\n    os._exit(0)\n", {"exited"}),
    "monkeypatched_builtins": (
        "import builtins\nclass _Never(Exception):\n    pass\nbuiltins.AssertionError = _Never\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.print = lambda *a, **k: None\n" + WRONG_ADD,
        {"wrong_answer", "runtime_error"},  # the patched isinstance also breaks the program's own server
    ),
    "signal_handlers_and_parent_kill": (
        "import os, signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n"
        "    pass\n" + WRONG_ADD,
        {"wrong_answer", "runtime_error", "exited"},
    ),
    "kill_own_process_group_in_call": ("import os, signal\ndef add(a, b):\n    os.killpg(0, signal.SIGKILL)\n",
                                       {"memory", "runtime_error", "exited"}),
    # --- values that would pass a comparison made by program code
    "custom_eq_object": ("class Always:\n    def __eq__(self, o):\n        return True\n"
                         "    __hash__ = object.__hash__\n    def __bool__(self):\n        return True\n"
                         "def add(a, b):\n    return Always()\n",
                         {"opaque_value"}),
    "int_subclass_with_eq": ("class Liar(int):\n    def __eq__(self, o):\n        return True\n"
                             "    __hash__ = int.__hash__\ndef add(a, b):\n    return Liar(0)\n", {"wrong_answer"}),
    "returns_mock_any": ("from unittest import mock\ndef add(a, b):\n    return mock.ANY\n", {"opaque_value"}),
    "raises_non_assertion_to_dodge": ("def add(a, b):\n    raise StopIteration\n", {"runtime_error"}),
    "reply_too_deep": ("def add(a, b):\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x\n",
                       {"runtime_error"}),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_tampering_scores_zero_with_a_named_kind(name):
    program, kinds = ATTACKS[name]
    out = code_score(f"```python\n{program}\n```", "", TESTS, timeout_s=1.5)
    assert out["score"] == 0.0 and out["passed"] == 0, out
    assert out["error"] in kinds, out


def test_forged_verdicts_in_a_matrix_fail_only_their_own_rows():
    """The co-evolution matrices use the same judge: tampering rows are all False, the honest one all True."""
    from rlkit.reward.coevolve import MatrixLimits, pass_matrices

    honest = "def add(a, b):\n    return a + b\n"
    names = ["nonce_read_from_main", "atexit_prints_result_line", "custom_eq_object", "sys_exit_before_tests"]
    programs = [honest] + [ATTACKS[n][0] for n in names]
    ref, gen = pass_matrices(programs, TESTS["tests"][:2], ["assert add(5, 5) == 10", "assert False"],
                             MatrixLimits(per_test_s=1.5, max_workers=2))
    assert ref[0].all() and gen[0].tolist() == [True, False]
    assert not ref[1:].any() and not gen[1:].any()


def test_the_test_sees_real_modules_and_builtins_not_the_programs():
    """A stdlib module the test uses as a module, and any builtin, come from the test's interpreter."""
    program = ("import types\nmath = types.SimpleNamespace(isclose=lambda *a, **k: True)\n"
               "sorted = lambda *a, **k: [1, 2, 3]\nlen = lambda x: 3\n"
               "def area(r):\n    return 0.0\ndef items():\n    return [9]\n")
    tests = ["assert math.isclose(area(1), 3.14159, rel_tol=1e-3)", "assert sorted(items()) == [1, 2, 3]",
             "assert len(items()) == 3"]
    assert judge([program], tests, JudgeLimits(test_s=2, total_s=20)).kinds == [["wrong_answer"] * 3]


HONEST = r'''
import math
from collections import namedtuple, Counter, deque
P = namedtuple("P", "x y")
LIMIT = 10
class Stack:
    def __init__(self): self.items = []
    def push(self, x): self.items.append(x)
    def pop(self): return self.items.pop()
    def __len__(self): return len(self.items)
    def __iter__(self): return iter(self.items)
class TooBig(ValueError):
    pass
def check(n):
    if n > LIMIT:
        raise TooBig("too big: %d" % n)
    if n < 0:
        raise ValueError("negative")
    return n
def gen(n):
    yield from range(n)
def point(): return P(1, 2)
def counts(s): return Counter(s)
def inplace(xs): xs.sort()
def big(): return 2 ** 5000
def nan(): return float("nan")
def many(): return {(1, 2): {3, 4}, "a": [b"x", 1.5, None, True, -0.0], 5: frozenset({1}), "c": 1 + 2j}
def dq(): return deque([1, 2])
def area(r): return math.pi * r * r
def third():
    from fractions import Fraction
    return Fraction(1, 3)
def money():
    from decimal import Decimal
    return Decimal("0.10") + Decimal("0.20")
print("the program may print")
'''
HONEST_TESTS = [
    "s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2\nassert s.pop() == 2\nassert list(s) == [1]",
    "try:\n    check(11)\nexcept TooBig as e:\n    assert str(e) == 'too big: 11'\nelse:\n    assert False",
    "try:\n    check(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False",
    "assert list(gen(3)) == [0, 1, 2]\ng = gen(3)\nassert next(g) == 0\nassert next(g) == 1",
    "assert sum(x for x in gen(1000)) == 499500",
    "assert point() == (1, 2)\nassert point().x == 1",
    "assert counts('aab') == {'a': 2, 'b': 1}",
    "xs = [3, 1, 2]\ninplace(xs)\nassert xs == [1, 2, 3]",
    "assert big() == 2 ** 5000",
    "assert math.isnan(nan())",
    "assert many() == {(1, 2): {3, 4}, 'a': [b'x', 1.5, None, True, 0.0], 5: frozenset({1}), 'c': 1 + 2j}",
    "from collections import deque\nassert dq() == deque([1, 2])",
    "assert math.isclose(area(1), 3.14159, rel_tol=1e-3)",  # `math` from the program's import
    "def check_(candidate):\n    assert candidate(3) == 3\ncheck_(check)",  # HumanEval style
    "assert LIMIT == 10",
    "assert check(5) is not None and isinstance(check(5), int)",
    "print('tests may print too')\nassert check(1) == 1",
    "from fractions import Fraction\nfrom decimal import Decimal\nassert third() == Fraction(1, 3)\n"
    "assert money() == Decimal('0.30')",
]


def test_honest_programs_pass_tests_of_many_shapes():
    out = code_score(f"```python\n{HONEST}\n```", json.dumps({"tests": HONEST_TESTS}), None, timeout_s=3,
                     total_timeout_s=60)
    assert out == {"score": 1.0, "error": "ok", "passed": len(HONEST_TESTS), "total": len(HONEST_TESTS)}


def test_what_the_judge_refuses_is_named():
    program = "class Box:\n    def __init__(self, v):\n        self.v = v\ndef make(v):\n    return Box(v)\n" \
              "def apply(f, x):\n    return f(x)\n"
    tests = ["assert make(1) == make(1)", "assert make(2).v == 2", "assert apply(lambda x: x, 1) == 1"]
    got = judge([program], tests, JudgeLimits(test_s=2, total_s=20)).kinds[0]
    assert got == ["opaque_value", "ok", "unsupported_value"]
    assert set(got) <= set(KINDS)


def test_each_test_gets_a_fresh_program_after_a_crash_or_timeout():
    program = "import os\ndef f(x):\n    if x == 1:\n        os._exit(1)\n    while x == 2:\n        pass\n" \
              "    return x\n"
    tests = ["assert f(0) == 0", "assert f(1) == 1", "assert f(3) == 3", "assert f(2) == 2", "assert f(4) == 4"]
    v = judge([program], tests, JudgeLimits(test_s=1.0, total_s=20))
    assert v.kinds[0] == ["ok", "runtime_error", "ok", "timeout", "ok"]
    assert v.processes == 4  # a tester, the server, and one fresh server after each of the two failures


def test_a_stuck_test_is_stopped_and_the_next_one_runs():
    v = judge(["def f():\n    return 1\n"], ["while True:\n    pass", "assert f() == 1"],
              JudgeLimits(test_s=0.5, total_s=20))
    assert v.kinds[0] == ["timeout", "ok"]


def test_many_programs_share_one_tester():
    programs = ["def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b", "def add(a b):"]
    v = judge(programs, ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], JudgeLimits(test_s=2, total_s=30))
    assert v.kinds == [["ok", "ok"], ["wrong_answer", "ok"], ["syntax_error", "syntax_error"]]
    assert v.processes == 4  # 3 servers + 1 tester


@pytest.mark.parametrize(
    "body, kind",
    [
        ("x = bytearray(4 << 30)", "memory"),
        ("while True:\n        pass", "timeout"),
        ("while True:\n        print('y' * 1000)", "output_limit"),
        ("import socket\n    socket.create_connection(('127.0.0.1', 9), timeout=1)", "runtime_error"),
    ],
)
def test_limits_hold_inside_a_call(body, kind):
    program = f"def add(a, b):\n    {body}\n    return a + b\n"
    v = judge([program], ["assert add(1, 2) == 3"], JudgeLimits(test_s=2, total_s=20, memory_mb=256,
                                                                output_bytes=100_000))
    assert v.kinds[0] == [kind]


def test_fork_bomb_inside_a_call_leaves_nothing_behind():
    program = ("import os, time\ndef add(a, b):\n    for _ in range(1000):\n        try:\n            pid = os.fork()\n"
               "        except OSError:\n            break\n        if pid == 0:\n            time.sleep(60)\n"
               "            os._exit(0)\n    return a + b\n")
    start = time.monotonic()
    v = judge([program], ["assert add(1, 2) == 3"], JudgeLimits(test_s=5, total_s=20))
    assert time.monotonic() - start < 15  # children die with the server, not at their sleep's end
    assert v.kinds[0] in (["ok"], ["timeout"])
    time.sleep(0.2)
    assert _judge_servers() == []


def _judge_servers() -> list[str]:
    """Live processes running the judge's server (forked copies included); pooled testers do not count."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
            if BOOT.encode() in cmdline and cmdline.endswith(b"\0serve\0"):
                found.append(pid)
        except OSError:
            pass
    return found


def test_io_tests_compare_outputs_here_and_ignore_tampering():
    """stdin/stdout tests: this process compares the output; exit codes and extra fds forge nothing."""
    spec = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
    cheats = [
        "import os\nos._exit(0)",  # no output, exit 0
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"exit\": 0}\\n')\n"
        "    except OSError:\n        pass\nprint(0)",  # a forged exit report on every fd, a wrong answer
        "import atexit, os\natexit.register(lambda: os.write(1, b'3\\n7\\n'))\nraise SystemExit(1)",
    ]
    for cheat in cheats:
        out = code_score(f"```python\n{cheat}\n```", spec, None)
        assert out["score"] == 0.0 and out["error"] in ("wrong_answer", "runtime_error"), (cheat, out)


MARK = "import builtins\nbuiltins.MARK = getattr(builtins, 'MARK', 0) + 1\nassert MARK == 1 and add(1, 2) == 3"


def test_trusted_tests_reuse_a_tester_untrusted_ones_never_do():
    """reuse_tester (dataset tests) keeps the tester process for the next call, with its state;
    without it (model-written tests) every call gets a fresh one."""
    program = "def add(a, b):\n    return a + b\n"
    fresh = [judge([program], [MARK], JudgeLimits(test_s=2, total_s=20)).kinds[0] for _ in range(2)]
    assert fresh == [["ok"], ["ok"]]
    reused = [judge([program], [MARK], JudgeLimits(test_s=2, total_s=20, reuse_tester=True)).kinds[0]
              for _ in range(2)]
    assert reused[1] == ["wrong_answer"]  # the same process: the first call's mark is still there


def test_a_generated_test_cannot_tamper_with_another_tests_verdict():
    from rlkit.reward.coevolve import MatrixLimits, pass_matrices

    tamper = "import __main__\n__main__.run_test = lambda client, src: ('ok', '')\nassert False"
    programs = ["def double(x):\n    return 2 * x", "def double(x):\n    return x + x"]
    _, gen = pass_matrices(programs, [], [tamper, "assert double(1) == 3"], MatrixLimits(per_test_s=1.5))
    assert gen[:, 1].tolist() == [False, False]


def test_interpreter_start_up_is_not_charged_to_a_test(tmp_path):
    """A slow start (a loaded machine; here an interpreter wrapper that sleeps 1 s) does not eat the
    0.5 s each test and the program's load get; only the whole call's total_s."""
    import stat
    import sys

    from rlkit.sandbox import SandboxLimits

    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 1\nexec {sys.executable} \"$@\"\n")
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp_path.chmod(0o755)
    limits = JudgeLimits(test_s=0.5, total_s=30, sandbox=SandboxLimits(python=str(slow)))
    v = judge(["def add(a, b):\n    return a + b\n"], ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], limits)
    assert v.kinds == [["ok", "ok"]]


def test_concurrent_scoring_keeps_honest_and_forged_apart():
    """The reward manager scores samples on threads that share the pool of testers: 24 samples, honest
    and tampering interleaved, each gets its own verdict."""
    from concurrent.futures import ThreadPoolExecutor

    honest = "```python\ndef add(a, b):\n    return a + b\n```"
    cheats = [ATTACKS[n][0] for n in ("nonce_read_from_main", "atexit_prints_result_line", "custom_eq_object",
                                      "forge_lines_on_every_fd_in_call", "sys_exit_in_call")]
    spec = {"tests": TESTS["tests"][:2]}
    jobs = [(honest, 1.0) if i % 2 else (f"```python\n{cheats[i // 2 % len(cheats)]}\n```", 0.0) for i in range(24)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda job: code_score(job[0], "", spec), jobs))
    assert [o["score"] for o in outs] == [want for _, want in jobs], outs
