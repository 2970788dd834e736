"""Targeted breakpoints: pause one rank, at one step, or at a named trainer phase.

With N data-parallel ranks a bare `breakpoint()` pauses all N and leaves N
debuggers to attach; pausing one rank is usually what you want (its peers wait
in the next collective, which is why debug mode relaxes the timeouts).

- `rlkit.debug.breakpoint(rank=0, step=None)` in code you are editing;
- `trainer.debug.break_at=actor.update_policy` (env `RLKIT_BREAK_AT`) pauses at a
  phase the trainer announces with `maybe_break("actor.update_policy")`, no edit needed.

Rules in `RLKIT_BREAK_AT` are comma separated: `PHASE[:rank=N|*][:step=N]`, PHASE may use
shell wildcards (`actor.*`). The default rank is 0.

The phases the workers announce (rollout.generate, actor.update_policy, ...) are declared with their calls in
rlkit/phases.py (`Call.breakpoint`). The step is the trainer's global step: every worker call carries it from
the driver (rlkit.controller.worker_group), so it is set in every role, in both worker layouts.

Test hooks (for the debug tests; comma separated phase patterns, every rank):
`RLKIT_TEST_RAISE_IN=actor.update_policy` raises there (a worker-side failure),
`RLKIT_TEST_BREAKPOINT_IN=actor.update_policy` calls the builtin breakpoint() there.
"""

from __future__ import annotations

import builtins
import fnmatch
import functools
import os
import sys
import time
from dataclasses import dataclass
from types import FrameType

from rlkit.errors import UserError
from rlkit.phases import break_names

BREAK_AT_ENV = "RLKIT_BREAK_AT"
BREAK_AT_KEY = "trainer.debug.break_at"
# Every phase a worker announces with maybe_break(), declared with its call in rlkit/phases.py (a test keeps the
# workers' literals in step with it)
PHASES = break_names()
TEST_RAISE_ENV = "RLKIT_TEST_RAISE_IN"
TEST_BREAKPOINT_ENV = "RLKIT_TEST_BREAKPOINT_IN"
RAY_WORKER_HOOK = "ray.util.rpdb.set_trace"  # what Ray puts in PYTHONBREAKPOINT in a worker
_step: int | None = None


def set_step(step: int | None) -> None:
    """Called by the trainer at the start of each step (in every worker) so `step=` filters work."""
    global _step
    _step = step


def current_step() -> int | None:
    return _step


def current_rank() -> int:
    """This process's rank: torch's RANK env var (0 when unset, e.g. a single process)."""
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


@dataclass(frozen=True)
class BreakRule:
    phase: str
    rank: int | None = 0  # None: every rank
    step: int | None = None  # None: every step

    def matches(self, phase: str, rank: int, step: int | None) -> bool:
        return (
            fnmatch.fnmatchcase(phase, self.phase)
            and (self.rank is None or self.rank == rank)
            and (self.step is None or self.step == step)
        )


def parse_break_at(spec: str) -> tuple[BreakRule, ...]:
    """Parse `actor.update_policy:rank=1:step=3,rollout.*` into rules (UserError on typos)."""
    rules = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        phase, *opts = item.split(":")
        fields: dict[str, int | None] = {}
        for opt in opts:
            key, _, value = opt.partition("=")
            if key not in ("rank", "step") or not value:
                raise UserError(f"{BREAK_AT_ENV}: bad option '{opt}' in '{item}'; use PHASE[:rank=N|*][:step=N]")
            try:
                fields[key] = None if value == "*" else int(value)
            except ValueError:
                raise UserError(f"{BREAK_AT_ENV}: '{opt}' in '{item}' needs a number (or rank=*)") from None
        rules.append(BreakRule(phase.strip(), **fields))  # type: ignore[arg-type]
    return tuple(rules)


def break_at_list(value: object) -> list[str]:
    """`trainer.debug.break_at` as a list of rules: a scalar (`actor.update_policy`, or comma separated)
    or a list; each rule's phase must name (or, with wildcards, match) a phase in PHASES."""
    if value is None or value == "":
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise UserError(f"{BREAK_AT_KEY}: expected a phase or a list of phases, got {value!r};"
                        " e.g. trainer.debug.break_at=actor.update_policy")  # fmt: skip
    rules = [r.strip() for item in items for r in item.split(",") if r.strip()]
    for rule in parse_break_at(",".join(rules)):
        if not any(fnmatch.fnmatchcase(phase, rule.phase) for phase in PHASES):
            raise UserError(f"{BREAK_AT_KEY}: unknown phase '{rule.phase}'; valid phases: {', '.join(PHASES)}")
    return rules


@functools.lru_cache(maxsize=8)
def _rules_for(spec: str) -> tuple[BreakRule, ...]:
    return parse_break_at(spec)


def break_rules() -> tuple[BreakRule, ...]:
    return _rules_for(os.environ.get(BREAK_AT_ENV, ""))


def breakpoint(rank: int | None = 0, step: int | None = None) -> None:  # noqa: A001 - mirrors the builtin on purpose
    """Pause here on rank `rank` (None: all ranks), at trainer step `step` (None: any step).

    Goes through `sys.breakpointhook`, so it opens the Ray debugger in a debug run, pdb in
    the driver, and is a no-op in a worker when debugging is off.
    """
    if rank is not None and current_rank() != rank:
        return
    if step is not None and _step != step:
        return
    _pause(sys._getframe(1))


def maybe_break(phase: str) -> bool:
    """Pause if a `RLKIT_BREAK_AT` rule names `phase` for this rank/step; returns whether it paused."""
    _test_hooks(phase)
    rules = break_rules()
    if not rules:
        return False
    rank = current_rank()
    if not any(rule.matches(phase, rank, _step) for rule in rules):
        return False
    # The wall-clock time says when the pause began (the debug tests measure "hit -> listed" from it).
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    print(f"[rlkit.debug] pausing at phase '{phase}' (rank {rank}, step {_step}) at {stamp}",
          file=sys.stderr, flush=True)  # fmt: skip
    _pause(sys._getframe(1))
    return True


def _names(env: str, phase: str) -> bool:
    patterns = os.environ.get(env, "")
    return bool(patterns) and any(fnmatch.fnmatchcase(phase, p.strip()) for p in patterns.split(",") if p.strip())


def _test_hooks(phase: str) -> None:
    """Test-only failure/breakpoint injection at a phase (see the module docstring); off unless the env asks."""
    if _names(TEST_BREAKPOINT_ENV, phase):
        builtins.breakpoint()  # a plain, stray breakpoint() as a user would leave it
    if _names(TEST_RAISE_ENV, phase):
        raise RuntimeError(f"injected failure in {phase} on rank {current_rank()} ({TEST_RAISE_ENV})")


def _pause(frame: FrameType) -> None:
    """Stop in `frame` (our caller's caller), not inside this helper.

    - Ray worker in a debug run: Ray's debugpy flow (listen, mark the worker paused so the
      dashboard lists it, wait for a client), with the stop placed on `frame`;
    - a process already under debugpy (VS Code's "Driver" launch): stop there, on `frame`;
    - otherwise with the default hook: pdb on `frame`; any other hook (disabled, custom) is honoured.
    """
    hook = os.environ.get("PYTHONBREAKPOINT", "")
    if hook == RAY_WORKER_HOOK and os.environ.get("RAY_DEBUG", "1") == "1" and _ray_debugpy_pause(frame):
        return
    if hook in ("", "pdb.set_trace"):
        pydevd = sys.modules.get("pydevd")
        if pydevd is not None and pydevd.get_global_debugger() is not None:
            pydevd.settrace(stop_at_frame=frame)
            return
        if sys.breakpointhook is sys.__breakpointhook__:
            import pdb

            pdb.Pdb().set_trace(frame)
            return
    sys.breakpointhook()


def _ray_debugpy_pause(frame: FrameType) -> bool:
    """Mirror of ray.util.debugpy.set_trace (Ray 2.60) with `stop_at_frame=frame`; False if Ray changed."""
    try:
        import debugpy
        import ray
        from ray.util import debugpy as ray_debugpy

        worker = ray._private.worker.global_worker
        ray_debugpy._ensure_debugger_port_open_thread_safe()
        ray_debugpy._override_breakpoint_hooks()
        paused = worker.worker_paused_by_debugger()
    except (ImportError, AttributeError):
        return False
    with paused:
        debugpy.wait_for_client()
    import pydevd  # importable only once debugpy is listening (it puts its vendored copy on sys.path)

    pydevd.settrace(stop_at_frame=frame)
    return True
