"""Peak memory of one phase (a worker call), so the step summary can say which phase set the high-water mark.

A process's lifetime peak (`ru_maxrss`) cannot tell phases apart. On Linux the kernel's peak RSS
(`VmHWM` in /proc/self/status) can be reset by writing "5" to /proc/self/clear_refs, so each worker
call measures its own peak: reset before, read after. On CUDA the allocator's peak is reset and read
the same way (`torch.cuda.reset_peak_memory_stats` / `max_memory_allocated`). Where neither reset
exists (not Linux), the RSS at the end of the call is reported instead, named `rss_end_gb`, because
it is not a peak.

The RSS is the whole process's: in the colocated layout the actor, reference and engine share one
process, so `update_actor`'s peak includes the (sleeping or awake) engine's resident memory. To tell the
parts apart, each call also reports how far it rose above its start (`rss_growth_gb`: the activations of an
update, the copies in flight during a weight sync), and the roles `note` the sizes of what they hold
(`memory/actor/optimizer_state_gb`, `memory/rollout/weights_gb`, ...) into the same per-step record.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

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


def trim_heap() -> bool:
    """Hand the heap's free pages back to the OS (glibc `malloc_trim`; False where there is none).

    glibc serves allocations below its mmap threshold (which rises to 32 MB as large blocks are freed, so most
    tensors of a small model) from the heap and keeps freed pages resident: after an update the freed
    activations stay in the RSS through the next phases. Measured here: 3 GB of freed 3 MB tensors stay resident
    until a trim, which returns them in 0.4 s (2 loaded cores); with little to return it takes milliseconds."""
    trim = _malloc_trim()
    return trim is not None and trim(0) >= 0


@functools.cache
def _malloc_trim() -> Any:
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return None


def rss_gb() -> float:
    """`rss_bytes` in GB."""
    return rss_bytes() / GB


class PhasePeaks:
    """Per-phase peaks of this process, kept until `pop()`: phase -> {metric name -> GB}."""

    def __init__(self) -> None:
        self.peaks: dict[str, dict[str, float]] = {}

    def note(self, phase: str, name: str, gb: float) -> None:
        """Keep the largest `gb` seen for (phase, name) until the next `pop()`."""
        seen = self.peaks.setdefault(phase, {})
        seen[name] = max(seen.get(name, 0.0), gb)

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        start = rss_bytes()
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
                row["rss_growth_gb"] = max(0.0, hwm * 1024 - start) / GB
            else:
                row["rss_end_gb"] = rss_gb()
            if cuda or (torch.cuda.is_available() and torch.cuda.is_initialized()):
                row["cuda_peak_allocated_gb"] = torch.cuda.max_memory_allocated() / GB
                row["cuda_peak_reserved_gb"] = torch.cuda.max_memory_reserved() / GB
            for key, value in row.items():
                self.note(phase, key, value)

    def pop(self) -> dict[str, dict[str, float]]:
        out, self.peaks = self.peaks, {}
        return out


_sink: PhasePeaks | None = None  # the record of this process's worker host (rlkit.controller.worker_group)


def use_sink(peaks: PhasePeaks | None) -> None:
    """Send this process's `note()`s to `peaks` (the worker host's record, popped by the driver each step)."""
    global _sink
    _sink = peaks


def note(part: str, name: str, gb: float) -> None:
    """A role's size of something it holds -> `memory/<part>/<name>` of this step (the max if noted twice);
    a no-op outside a worker host (a role built directly in a test)."""
    if _sink is not None:
        _sink.note(part, name, gb)


def tensor_gb(tensors: Iterable[torch.Tensor | None]) -> float:
    """Bytes of the tensors' local data (a DTensor's shard), in GB; None entries count 0."""
    total = 0
    for t in tensors:
        if t is not None:
            local = t.to_local() if hasattr(t, "to_local") else t
            total += local.numel() * local.element_size()
    return total / GB


CALL_PEAKS = ("rss_peak_gb", "rss_end_gb")  # a measured call's row (a role's notes have neither)


def phase_metrics(per_worker: list[dict[str, dict[str, float]]]) -> dict[str, float]:
    """Workers' peaks -> `memory/<phase>/<name>` metrics, the max over workers (the largest sets the limit),
    and `memory/worker/rss_peak_gb`: the largest worker process's peak over all its calls."""
    out: dict[str, float] = {}
    for peaks in per_worker:
        for phase, row in peaks.items():
            for name, value in row.items():
                key = f"memory/{phase}/{name}"
                out[key] = max(out.get(key, 0.0), value)
        calls = [row[k] for row in peaks.values() for k in CALL_PEAKS if k in row]
        if calls:
            out[WORKER_PEAK] = max(out.get(WORKER_PEAK, 0.0), max(calls))
    return out


def is_call_peak(key: str) -> bool:
    """Whether a `memory/...` key is one worker call's measurement (not a role's noted size, not a process's)."""
    parts = key.split("/")
    return len(parts) == 3 and parts[1] not in ("driver", "worker") and parts[2] in CALL_KINDS


CALL_KINDS = ("rss_peak_gb", "rss_end_gb", "rss_growth_gb", "cuda_peak_allocated_gb", "cuda_peak_reserved_gb")
WORKER_PEAK = "memory/worker/rss_peak_gb"
DRIVER_PEAK = "memory/driver/rss_peak_gb"
