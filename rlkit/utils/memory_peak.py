"""Peak memory of one phase (a worker call), so the step summary can say which phase set the high-water mark.

A process's lifetime peak (`ru_maxrss`) cannot tell phases apart. On Linux the kernel's peak RSS
(`VmHWM` in /proc/self/status) can be reset by writing "5" to /proc/self/clear_refs, so each worker
call measures its own peak: reset before, read after. On CUDA the allocator's peak is reset and read
the same way (`torch.cuda.reset_peak_memory_stats` / `max_memory_allocated`). Where neither reset
exists (not Linux), the RSS at the end of the call is reported instead, named `rss_end_gb`, because
it is not a peak.

The RSS is the whole process's: in the colocated layout the actor, reference and engine share one
process, so `update_actor`'s peak includes the (sleeping or awake) engine's resident memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

GB = 2**30
_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_kb(field: str) -> int | None:
    try:
        with open(_STATUS) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_rss_peak() -> bool:
    """Reset the kernel's peak RSS of this process to its current RSS; False where that is not possible."""
    try:
        with open(_CLEAR_REFS, "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def rss_bytes() -> int:
    """This process's resident memory now (psutil, on every platform); the one place that reads it."""
    import psutil

    return psutil.Process().memory_info().rss


def rss_gb() -> float:
    """`rss_bytes` in GB."""
    return rss_bytes() / GB


class PhasePeaks:
    """Per-phase peaks of this process, kept until `pop()`: phase -> {metric name -> GB}."""

    def __init__(self) -> None:
        self.peaks: dict[str, dict[str, float]] = {}

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        resettable = reset_rss_peak()
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            row: dict[str, float] = {}
            hwm = _status_kb("VmHWM") if resettable else None
            if hwm is not None:
                row["rss_peak_gb"] = hwm / 2**20
            else:
                row["rss_end_gb"] = rss_gb()
            if cuda or (torch.cuda.is_available() and torch.cuda.is_initialized()):
                row["cuda_peak_allocated_gb"] = torch.cuda.max_memory_allocated() / GB
                row["cuda_peak_reserved_gb"] = torch.cuda.max_memory_reserved() / GB
            seen = self.peaks.setdefault(phase, {})
            for key, value in row.items():
                seen[key] = max(seen.get(key, 0.0), value)

    def pop(self) -> dict[str, dict[str, float]]:
        out, self.peaks = self.peaks, {}
        return out


def phase_metrics(per_worker: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Workers' peaks -> `memory/<phase>/<name>` metrics, the max over workers (the largest sets the limit)."""
    out: dict[str, float] = {}
    for peaks in per_worker:
        for phase, row in peaks.items():
            for name, value in row.items():
                key = f"memory/{phase}/{name}"
                out[key] = max(out.get(key, 0.0), value)
    return out
