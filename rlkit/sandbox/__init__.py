"""Untrusted code, run where it cannot reach the trainer: the subprocess sandbox and the code judge on top of it.

Periphery of rlkit: the reward layer's `code` scorer and the agents' code tool use it through this face.

* `run_program` / `run_many` / `SandboxProcess` (process.py): one program per fresh `python -I` in its own
  session, with time, memory, output and (where the host allows) namespace limits; `sandbox_capabilities`
  (capabilities.py) says which limits held on this machine.
* `judge` (code_judge.py): assert-style tests run in a second sandboxed process that the program under test
  cannot reach, so the program cannot forge its own verdict.
"""

from rlkit.sandbox.capabilities import sandbox_capabilities
from rlkit.sandbox.code_judge import BOOT, KINDS, JudgeLimits, judge
from rlkit.sandbox.process import (
    SandboxJob,
    SandboxLimits,
    SandboxProcess,
    SandboxResult,
    pump,
    run_many,
    run_program,
)

__all__ = [
    "BOOT", "KINDS", "JudgeLimits", "SandboxJob", "SandboxLimits", "SandboxProcess", "SandboxResult", "judge",
    "pump", "run_many", "run_program", "sandbox_capabilities",
]
