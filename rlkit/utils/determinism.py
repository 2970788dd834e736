"""`trainer.deterministic`: the switches that make a rerun (same seed, config and machine) repeat a run exactly.

The seeds are already fixed by the run (data order, rollout sampling per step, init); what varies without this
is the kernels: cuBLAS/cuDNN pick reduction orders per call, atomics sum in arrival order, and vLLM batches
requests as they come. The driver passes `deterministic_env(True)` to every worker process and each process
calls `apply_deterministic()` before it builds a model. On CPU float32 the kernels are already repeatable;
the switch costs nothing there and the test holds it to bit-for-bit equality.
"""

from __future__ import annotations

import os

DETERMINISTIC_ENV = "RLKIT_DETERMINISTIC"


def deterministic_env(on: bool) -> dict[str, str]:
    """The environment variables of a deterministic process (empty when off): ours, and cuBLAS's fixed workspace
    (needed by torch's deterministic matmuls on CUDA)."""
    if not on:
        return {}
    return {DETERMINISTIC_ENV: "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def apply_deterministic() -> bool:
    """In a process whose environment asks for it: torch's deterministic algorithms (an op without one raises,
    naming itself, rather than silently varying), cuDNN without benchmarking, and on a GPU vLLM's batch-invariant
    kernels (`VLLM_BATCH_INVARIANT`, vLLM >= 0.11; its CPU attention has none and would refuse it); returns
    whether it was asked. Runs before any engine is built, so vLLM reads the variable."""
    if os.environ.get(DETERMINISTIC_ENV) != "1":
        return False
    import torch

    if torch.cuda.is_available():
        os.environ.setdefault("VLLM_BATCH_INVARIANT", "1")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return True
