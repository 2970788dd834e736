"""Ray tasks and actors the debug tests pause in (shipped to workers by value, see conftest)."""

from __future__ import annotations

import os

import ray

import rlkit.debug


@ray.remote
class Policy:
    """Stands in for a training worker: one method pauses at a bare breakpoint()."""

    def work(self, x: int) -> int:
        secret = x * 7
        breakpoint()  # BP-work
        y = secret + 1
        return y

    def targeted(self, x: int) -> int:
        """Pauses only where RANK == 0 (RANK comes from the actor's runtime_env)."""
        local_value = x + 100
        rlkit.debug.breakpoint(rank=0)
        after = local_value * 2  # BP-targeted (the stop lands on the line after the call)
        return after

    def phase(self, x: int) -> int:
        rlkit.debug.set_step(3)
        value = x - 1
        rlkit.debug.maybe_break("actor.update_policy")
        value += 1  # BP-phase
        return value

    def rank(self) -> str:
        return os.environ.get("RANK", "")


@ray.remote(max_retries=0)
def score(x: int) -> float:
    """A reward function that blows up (post-mortem target)."""
    partial = x * 0.5
    raise ValueError(f"reward exploded on sample {x} (partial={partial})")


@ray.remote(max_retries=0)
def stray(x: int) -> int:
    """A forgotten breakpoint(): must not hang a run that is not in debug mode."""
    breakpoint()
    return x + 1


def line_of(marker: str) -> int:
    """Line number of the source line tagged `# <marker>` in this file."""
    with open(__file__) as fh:
        for n, line in enumerate(fh, 1):
            if line.rstrip().endswith(f"# {marker}") or f"# {marker} " in line:
                return n
    raise LookupError(marker)
