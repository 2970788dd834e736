"""Judge model-written programs against assert-style tests; the program cannot forge the verdict.

Why: an RL policy optimises whatever decides its reward. When the program under test and the code that
reports the verdict share an interpreter, the program can patch the reporting (builtins, `sys.exit`,
atexit hooks, the result line, inherited fds) and score 1.0 on `assert False`.

Design (threat model and guarantees: docs/rewards.md). Per program two sandboxed processes
(rlkit.sandbox), which never share an interpreter, and this process between them:

* the *server* loads the program and answers requests on its objects with plain data;
* the *tester* runs the tests; each name the program defines is a proxy whose every use becomes a
  request, relayed here to the server; replies are decoded in the tester into plain values (never an
  object of the program's making), so the comparison and the verdict happen where no program code runs;
* this process (trusted) relays one request at a time, enforces each test's time limit and each reply's
  size, restarts a server that died or timed out (the next test gets a fresh one) and accepts verdicts
  only from the tester. Anything unexpected on the server's channel is a `protocol_error`.

The child side is one program in three parts, rlkit/sandbox/_judge_{wire,serve,test}.py (stdlib only, run
with `python -I -c`), joined by `child_source`.
"""

from __future__ import annotations

import ast
import atexit
import json
import marshal
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rlkit.sandbox.process import SandboxLimits, SandboxProcess, pump

CHILD_PARTS = ("_judge_wire.py", "_judge_serve.py", "_judge_run.py")


def child_source() -> str:
    """The child program: its parts in order, without the imports between parts (`from rlkit.sandbox._judge_*`,
    there for linters and readers) and with only the first part's `from __future__` line."""
    joined = []
    for index, name in enumerate(CHILD_PARTS):
        text = Path(__file__).with_name(name).read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ImportFrom) and (
                (node.module or "").startswith("rlkit.sandbox._judge_") or (index and node.module == "__future__")
            ):
                lines[node.lineno - 1 : node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
        joined.append("\n".join(lines))
    return "\n\n".join(joined) + "\n"


CHILD_SOURCE = child_source()
# Compiling that source costs ~20 ms per process; the same interpreter gets it compiled, as marshal hex in argv.
_CHILD_CODE = marshal.dumps(compile(CHILD_SOURCE, "rlkit_judge_child.py", "exec")).hex()
BOOT = "import marshal,sys;exec(marshal.loads(bytes.fromhex(sys.argv[1])))  # rlkit code judge"

# Error kinds of one check. The first seven are those of the stdin/stdout scorer (rlkit.reward.code: the sandbox's
# STATUSES plus wrong_answer), so both scorers' kinds read alike; the rest only the judge can tell:
# exited: the program ended (sys.exit / os._exit) before or while answering;
# protocol_error: something other than an answer appeared on the program's channel (tampering);
# opaque_value: the test compared or truth-tested a program-made object (e.g. one with its own __eq__);
# unsupported_value: the test passed the program something that is not plain data (e.g. a lambda).
KINDS = ("ok", "wrong_answer", "runtime_error", "timeout", "memory", "syntax_error", "output_limit",
         "exited", "protocol_error", "opaque_value", "unsupported_value")
_LOAD_KINDS = frozenset({"ok", "syntax_error", "runtime_error", "exited", "memory"})
_GRACE_S = 0.5  # after a timed-out call, how long the tester gets to report
_REUSE_WAIT_S = 1.0  # how long a pooled tester that has not said UP yet is waited for at the end of a call
_POOL_AGE_S, _POOL_USES, _POOL_IDLE = 300.0, 200, 2 * (os.cpu_count() or 1)  # reused testers


@dataclass(frozen=True)
class JudgeLimits:
    """Limits of one `judge` call. `test_s` bounds each test (its calls included) and each program load;
    `total_s` the whole call (tests not started by then count as timeouts)."""

    test_s: float = 3.0
    total_s: float = 30.0
    memory_mb: int = 1024
    output_bytes: int = 1 << 20  # what each process may print (stderr; stdout is the channel)
    message_bytes: int = 16 << 20  # the largest single reply (one value) from the program
    sandbox: SandboxLimits = SandboxLimits()  # isolation settings and the interpreter
    # Trusted tests only (a dataset's): the tester process may come from, and go back to, a pool shared
    # by judge calls, which saves one process start per call. Never for model-written tests: one test
    # could then tamper with the tester that judges another.
    reuse_tester: bool = False


@dataclass
class Verdicts:
    """kinds[i][t]: the error kind of program i on test t ("ok" = passed); `processes` started."""

    kinds: list[list[str]]
    processes: int = 0  # sandboxed processes used: started, or a tester taken from the pool

    def passed(self) -> list[list[bool]]:
        return [[k == "ok" for k in row] for row in self.kinds]


def judge(programs: Sequence[str], tests: Sequence[str], limits: JudgeLimits | None = None) -> Verdicts:
    """Every program against every test. One tester process serves all programs (a fresh namespace per
    test, proxies dropped between programs); each program gets its own server, started one program ahead."""
    run = _Judge(list(tests), limits or JudgeLimits())
    try:
        return Verdicts([run.program(i, programs) for i in range(len(programs))], run.processes)
    finally:
        run.close()


class _TesterPool:
    """Idle tester processes for trusted tests, shared by judge calls in this process (thread-safe).

    A tester is retired after `_POOL_AGE_S` or `_POOL_USES` judge calls; idle ones are killed at exit
    (and end by themselves when this process dies: their stdin closes). A forked child starts empty.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.idle: dict[tuple, list[tuple[SandboxProcess, int]]] = {}
        atexit.register(self.clear)

    def take(self, key: tuple, need_s: float) -> tuple[SandboxProcess, int] | None:
        """An idle tester that will live at least `need_s` more seconds, and its use count; or None."""
        while True:
            with self.lock:
                if self.pid != os.getpid():  # the pipes belong to the parent process
                    self.pid, self.idle = os.getpid(), {}
                if not self.idle.get(key):
                    return None
                proc, uses = self.idle[key].pop()
            now = time.monotonic()
            pump([proc], now)  # notice a tester that ended while idle
            if proc.exited or now - proc.start > _POOL_AGE_S or proc.hard_deadline - now < need_s:
                proc.finish()
                continue
            return proc, uses

    def give(self, key: tuple, proc: SandboxProcess, uses: int) -> None:
        with self.lock:
            keep = uses < _POOL_USES and len(self.idle.get(key, ())) < _POOL_IDLE and self.pid == os.getpid()
            if keep:
                self.idle.setdefault(key, []).append((proc, uses))
        if not keep:
            proc.finish()

    def clear(self) -> None:
        with self.lock:
            procs = [p for entries in self.idle.values() for p, _ in entries] if self.pid == os.getpid() else []
            self.idle.clear()
        for proc in procs:
            proc.finish()


_POOL = _TesterPool()


class _Judge:
    def __init__(self, tests: list[str], limits: JudgeLimits) -> None:
        self.tests, self.limits = tests, limits
        self.deadline = time.monotonic() + limits.total_s
        self.processes = 0
        self.servers: dict[int, SandboxProcess] = {}
        self.tester: SandboxProcess | None = None
        self.tester_uses = 0  # judge calls the current tester has served before this one
        self.live: list[SandboxProcess] = []
        self.up: set[SandboxProcess] = set()  # processes that said UP (held: an id could be reused)

    # ------------------------------------------------------------------------------------ processes

    def _spawn(self, role: str, first_line: str | None = None, pooled: bool = False) -> SandboxProcess:
        left = max(1.0, self.deadline - time.monotonic()) + 2 * _GRACE_S
        if pooled:  # each test's time is bounded here; the process's own limits only stop a runaway
            left += _POOL_AGE_S
        box = replace(self.limits.sandbox, wall_s=left, cpu_s=math.ceil(left) + 1,
                      memory_mb=self.limits.memory_mb, output_bytes=self.limits.output_bytes)
        same = os.path.realpath(box.python) == os.path.realpath(sys.executable)
        argv = ["-c", BOOT, _CHILD_CODE, role] if same else ["-c", CHILD_SOURCE, role]
        proc = SandboxProcess(box, argv=argv, interactive=True)
        if first_line is not None:
            proc.send(first_line)
        self.processes += 1
        self.live.append(proc)
        return proc

    def _server(self, i: int, programs: Sequence[str]) -> SandboxProcess:
        """Program i's server, and program i+1's started in the background (its load overlaps our tests)."""
        for j in (i, i + 1):
            if j < len(programs) and j not in self.servers and (j == i or time.monotonic() < self.deadline):
                self.servers[j] = self._spawn("serve", "S " + json.dumps({"src": programs[j]}) + "\n")
        return self.servers.pop(i)

    def _fresh_tester(self) -> SandboxProcess:
        if self.tester is None or self.tester.exited:
            if self.tester is not None:
                self._drop(self.tester)
            self.tester = None
            taken = _POOL.take(self._pool_key(), self.deadline - time.monotonic() + 10) \
                if self.limits.reuse_tester else None
            if taken is not None:
                (self.tester, self.tester_uses), self.processes = taken, self.processes + 1
                self.live.append(self.tester)
                self.up.add(self.tester)
            else:
                self.tester, self.tester_uses = self._spawn("test", pooled=self.limits.reuse_tester), 0
        return self.tester

    def _pool_key(self) -> tuple:
        return (self.limits.sandbox, self.limits.memory_mb, self.limits.output_bytes)

    def _drop(self, proc: SandboxProcess) -> str:
        """Kill and reap `proc`; the error kind its end stands for."""
        res = proc.finish()
        if proc in self.live:
            self.live.remove(proc)
        return {"ok": "exited"}.get(res.status, res.status)

    def close(self) -> None:
        tester = self.tester
        if self.limits.reuse_tester and tester is not None and tester in self.live and self._reusable(tester):
            self.live.remove(tester)
            _POOL.give(self._pool_key(), tester, self.tester_uses + 1)
        for proc in list(self.live):
            self._drop(proc)

    def _reusable(self, tester: SandboxProcess) -> bool:
        """Alive, started (its UP read: a call whose program never loaded may not have), nothing unread
        or unsent: the next call starts from a clean line."""
        until = time.monotonic() + _REUSE_WAIT_S  # its start-up is paid for: worth a short wait
        while tester not in self.up and not tester.exited and time.monotonic() < until:
            line = tester.take_line(64)
            if line == b"UP":
                self.up.add(tester)
            elif line is not None:
                return False
            else:
                pump([tester], until)
        return not tester.exited and tester in self.up and tester.drained
    def _wait(self, until: float) -> None:
        pump(self.live, until)

    # ------------------------------------------------------------------------------------ one program

    def program(self, i: int, programs: Sequence[str]) -> list[str]:
        n = len(self.tests)
        if time.monotonic() >= self.deadline:
            return ["timeout"] * n
        server = self._server(i, programs)
        tester = self._fresh_tester()  # starts alongside the server
        kind = self._ready(server)
        kinds: list[str] = []
        if kind == "ok":
            tester.send("N\n")
        for t, src in enumerate(self.tests):
            if kind != "ok":  # the program did not load (or stopped loading after a restart)
                kinds.append(kind)
                continue
            if time.monotonic() >= self.deadline:
                kinds.append("timeout")
                continue
            if server.exited:  # it died or timed out in the previous test: a fresh one for this test
                self._drop(server)
                server = self._spawn("serve", "S " + json.dumps({"src": programs[i]}) + "\n")
                kind = self._ready(server)
                if kind != "ok":
                    kinds.append(kind)
                    continue
            kinds.append(self._test(server, t, src))
        self._drop(server)
        return kinds

    def _started(self, proc: SandboxProcess) -> bool:
        """Wait for `proc`'s first line, `UP`: its interpreter runs. Start-up (slow on a loaded machine) is
        not charged to a test or to the program's load; only to the whole call's `total_s`."""
        while proc not in self.up:
            line = proc.take_line(64)
            if line == b"UP":
                self.up.add(proc)
            elif line is not None:
                proc.kill("protocol_error")
            elif proc.exited or time.monotonic() >= self.deadline:
                return False
            else:
                self._wait(self.deadline)
        return True

    def _ready(self, server: SandboxProcess) -> str:
        """Wait for the program to load: its load kind ("ok", "syntax_error", ...)."""
        if not self._started(server):
            server.kill("timeout")
            return self._drop(server)
        until = min(time.monotonic() + self.limits.test_s, self.deadline)
        while True:
            line = server.take_line(4096)
            if line is not None:
                try:
                    kind = json.loads(line.decode()[len("READY "):])["kind"] if line.startswith(b"READY ") else None
                except (ValueError, TypeError, KeyError, RecursionError):
                    kind = None
                if kind not in _LOAD_KINDS:
                    server.kill("protocol_error")
                    return self._drop(server)
                return kind
            if server.exited:
                return self._drop(server)
            if time.monotonic() >= until:
                server.kill("timeout")
                return self._drop(server)
            self._wait(until)

    # ------------------------------------------------------------------------------------ one test

    def _test(self, server: SandboxProcess, t: int, src: str) -> str:
        tester = self._fresh_tester()
        if not self._started(tester):
            tester.kill("timeout")
            return self._drop(tester)
        cap = self.limits.message_bytes
        until = min(time.monotonic() + self.limits.test_s, self.deadline)
        tester.send("T " + json.dumps({"i": t, "src": src}) + "\n")
        pending: str | None = None  # id of the request the server is answering
        forced: str | None = None  # a failure this process decided (timeout); it wins over the verdict
        while True:
            line = tester.take_line(cap)
            if line is not None:
                tag, _, rest = line.partition(b" ")
                if tag == b"V":
                    return forced or self._verdict(rest, t)
                rid = rest.partition(b" ")[0].decode("ascii", "replace")
                if tag != b"Q" or pending is not None:
                    tester.kill("protocol_error")
                    return forced or self._drop(tester)
                if server.exited:
                    tester.send(f"F {rid} {self._server_end(server)}\n")
                else:
                    server.send(line.decode("utf-8", "surrogatepass") + "\n")
                    pending = rid
                continue
            reply = server.take_line(cap) if pending is not None else None
            if reply is not None or (pending is None and server.out and not server.exited):  # output nobody asked for
                if pending is not None and reply is not None and reply.startswith(f"R {pending} ".encode()):
                    tester.send(reply.decode("utf-8", "surrogatepass") + "\n")
                else:
                    server.kill("protocol_error")
                    if pending is not None:
                        tester.send(f"F {pending} protocol_error\n")
                pending = None
                continue
            if pending is not None and server.exited:
                tester.send(f"F {pending} {self._server_end(server)}\n")
                pending = None
                continue
            if tester.exited:
                return forced or self._drop(tester)
            if time.monotonic() >= until:
                if forced is not None or pending is None:  # the test itself is stuck: end the tester
                    tester.kill("timeout")
                    self._drop(tester)
                    return "timeout"
                server.kill("timeout")
                tester.send(f"F {pending} timeout\n")
                pending, forced = None, "timeout"
                until = time.monotonic() + _GRACE_S
                continue
            self._wait(until)

    def _server_end(self, server: SandboxProcess) -> str:
        """The kind a dead server stands for (reaped once; later calls see the same result)."""
        return {"ok": "exited"}.get(server.finish().status, server.finish().status)

    def _verdict(self, payload: bytes, t: int) -> str:
        try:
            got = json.loads(payload)
            kind = got["kind"] if got.get("i") == t else None
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            kind = None
        if kind not in KINDS:
            self.tester.kill("protocol_error")
            return "protocol_error"
        return kind
