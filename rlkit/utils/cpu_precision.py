"""Which dtype a CPU trains in: bf16 compute only where this CPU's bf16 matmul is measurably faster.

CPUs differ: Intel with AMX-BF16 and AMD Zen 4+ with AVX512-BF16 multiply bf16 in hardware (often
2x+ fp32), while AVX2-only or AVX-512 cores without the bf16 extension convert and run bf16 slower
than fp32. The flags say what the hardware has, but only a measurement says what torch's kernels
(oneDNN/mkldnn) make of it at this thread count, so `param_dtype: auto` on CPU is decided here by
timing a bf16 and an fp32 matmul of a model-like size (`rlkit.utils.matmul_timing`, the function
behind bench/peak.py), interleaved so machine load hits both alike. bf16 is chosen when it is at
least `MIN_SPEEDUP` times faster; the result is cached once per machine in a JSON file
($RLKIT_CACHE_DIR or ~/.cache/rlkit, `cpu_precision.json`), keyed by the CPU model, the ISA flags,
torch's version, the thread count and the size, so start-up measures at most once (~1-3 s; a
256^3 probe first stops early where bf16 is emulated).

`RLKIT_CPU_COMPUTE_DTYPE=float32|bfloat16` overrides the measurement (tests pin float32 with it).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import platform
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlkit.utils.matmul_timing import matmul_gflops

log = logging.getLogger(__name__)

#: /proc/cpuinfo flags that decide what bf16 costs (hardware bf16 dot products, AMX tiles, the vector width).
ISA_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
#: bf16 compute must be at least this much faster than fp32 to be worth its rounding.
MIN_SPEEDUP = 1.3
#: The timed matmul: (TOKENS x SIZE) @ (SIZE x SIZE), about a small model's projection over a micro-batch.
SIZE, TOKENS = 1024, 1024
#: The first, small matmul; bf16 below PROBE_STOP x fp32 there is not measured further (it is emulated).
PROBE, PROBE_STOP = 256, 0.5
OVERRIDE_ENV = "RLKIT_CPU_COMPUTE_DTYPE"
CACHE_ENV = "RLKIT_CACHE_DIR"
CACHE_FILE = "cpu_precision.json"


@dataclass(frozen=True)
class CpuIsa:
    """What the CPU offers for bf16: its model name, the `ISA_FLAGS` present and torch's kernel level."""

    model: str
    flags: tuple[str, ...]
    torch_capability: str

    @property
    def bf16_hardware(self) -> bool:
        return "amx_bf16" in self.flags or "avx512_bf16" in self.flags

    def describe(self) -> str:
        return f"{self.model} [{' '.join(self.flags) or 'no avx2'}; torch {self.torch_capability}]"


def read_isa(cpuinfo: str | None = None, torch_capability: str | None = None) -> CpuIsa:
    """The ISA from /proc/cpuinfo's first processor (or the text given) and `torch.backends.cpu`."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    if torch_capability is None:
        torch_capability = torch.backends.cpu.get_cpu_capability()
    return CpuIsa(model, tuple(f for f in ISA_FLAGS if f in flags), torch_capability)


@dataclass(frozen=True)
class PrecisionChoice:
    """The CPU compute dtype and the measurement behind it."""

    dtype: str  # "bfloat16" | "float32"
    fp32_gflops: float
    bf16_gflops: float
    threads: int
    isa: str  # CpuIsa.describe()
    reason: str  # "measured" | "cached" | f"${OVERRIDE_ENV}"

    @property
    def speedup(self) -> float:
        return self.bf16_gflops / max(self.fp32_gflops, 1e-9)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def line(self) -> str:
        """One log/plan line: the dtype, why, the numbers and the ISA."""
        if self.reason.startswith("$"):
            return f"CPU compute dtype {self.dtype} (set by {self.reason}) on {self.isa}"
        return (
            f"CPU compute dtype {self.dtype}: bf16 matmul {self.speedup:.2f}x fp32 "
            f"({self.bf16_gflops:.1f} vs {self.fp32_gflops:.1f} GFLOP/s, {self.threads} thread(s), "
            f"{self.reason}; bf16 needs >= {MIN_SPEEDUP}x) on {self.isa}"
        )


def decide(
    fp32_gflops: float,
    bf16_gflops: float,
    isa: CpuIsa,
    threads: int,
    reason: str = "measured",
    min_speedup: float = MIN_SPEEDUP,
) -> PrecisionChoice:
    """bf16 when its measured matmul rate is at least `min_speedup` x fp32's, else fp32.

    The flags are reported, not trusted: a CPU with bf16 instructions whose kernels this torch does not
    use (or an emulating one that happens to be fast) is judged by what it measured."""
    dtype = "bfloat16" if bf16_gflops >= min_speedup * fp32_gflops > 0 else "float32"
    return PrecisionChoice(dtype, fp32_gflops, bf16_gflops, threads, isa.describe(), reason)


def measure(
    threads: int, size: int = SIZE, tokens: int = TOKENS, repeats: int = 3, rounds: int = 2
) -> tuple[float, float]:
    """(fp32, bf16) GFLOP/s at `threads` torch threads: the best of `rounds` interleaved rounds.

    A 256^3 probe comes first: where bf16 has no fast kernel it runs ~100x slower than fp32 (AVX2:
    0.3 vs 46 GFLOP/s per core), and the full size would take minutes; a probe below `PROBE_STOP`
    x fp32 decides (fp32) with the probe's numbers."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fp32, bf16 = _interleaved(PROBE, PROBE, 2, rounds)
        if bf16 < PROBE_STOP * fp32:
            return fp32, bf16
        return _interleaved(size, tokens, repeats, rounds)
    finally:
        torch.set_num_threads(before)


def _interleaved(size: int, tokens: int, repeats: int, rounds: int) -> tuple[float, float]:
    """Best (fp32, bf16) GFLOP/s over `rounds` alternating rounds (a busy spell on a shared machine hits both)."""
    fp32 = bf16 = 0.0
    for _ in range(rounds):
        fp32 = max(fp32, matmul_gflops(size, torch.float32, repeats, m=tokens)["gflops"])
        bf16 = max(bf16, matmul_gflops(size, torch.bfloat16, repeats, m=tokens)["gflops"])
    return fp32, bf16


def cache_key(isa: CpuIsa, threads: int, size: int = SIZE, tokens: int = TOKENS) -> str:
    return (
        f"{isa.model}|{','.join(isa.flags)}|{isa.torch_capability}|torch {torch.__version__}"
        f"|{threads} threads|{tokens}x{size}x{size}"
    )


def cache_path(cache_dir: str | Path | None = None) -> Path:
    root = cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rlkit"
    return Path(root) / CACHE_FILE


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process measures at a time (workers starting together would slow each other's timing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def choose(
    threads: int | None = None,
    isa: CpuIsa | None = None,
    cache_dir: str | Path | None = None,
    measure_fn: Callable[[int], tuple[float, float]] = measure,
) -> PrecisionChoice:
    """The CPU compute dtype at `threads` (default: torch's current count): the override, the cached
    measurement of this machine, or a new measurement (then cached)."""
    isa = isa or read_isa()
    threads = threads or torch.get_num_threads()
    forced = os.environ.get(OVERRIDE_ENV, "").strip()
    if forced:
        if forced not in ("float32", "bfloat16"):
            raise ValueError(f"${OVERRIDE_ENV}={forced!r}: use float32 or bfloat16 (or unset it to measure)")
        return PrecisionChoice(forced, 0.0, 0.0, threads, isa.describe(), f"${OVERRIDE_ENV}")
    return measured_rates(threads, isa, cache_dir, measure_fn)


def measured_rates(
    threads: int | None = None,
    isa: CpuIsa | None = None,
    cache_dir: str | Path | None = None,
    measure_fn: Callable[[int], tuple[float, float]] = measure,
    load_fn: Callable[[], float] = lambda: os.getloadavg()[0],
) -> PrecisionChoice:
    """This machine's fp32 and bf16 matmul rates at `threads` (cached per machine, measured if absent) and the
    dtype they decide, whatever the override says: `perf/mfu` divides by the rate of the dtype in use."""
    isa = isa or read_isa()
    threads = threads or torch.get_num_threads()
    path, key = cache_path(cache_dir), cache_key(isa, threads)
    hit = _read(path).get(key)
    if hit and not _remeasure(hit, load_fn()):
        return decide(hit["fp32_gflops"], hit["bf16_gflops"], isa, threads, "cached")
    try:
        with _locked(path):
            hit = _read(path).get(key)  # another process may have measured while this one waited
            load = load_fn()
            if hit and not _remeasure(hit, load):
                return decide(hit["fp32_gflops"], hit["bf16_gflops"], isa, threads, "cached")
            fp32, bf16 = measure_fn(threads)
            if hit:  # a rate is what the machine can do: keep the best of a busy and a quieter measurement
                fp32, bf16 = max(fp32, hit["fp32_gflops"]), max(bf16, hit["bf16_gflops"])
            choice = decide(fp32, bf16, isa, threads, "measured")
            _store(path, key, choice, load)
    except OSError as exc:  # a read-only home: measure in every process rather than fail the run
        log.warning("precision cache %s not writable (%s); measuring without it", path, exc)
        choice = decide(*measure_fn(threads), isa, threads, "measured")
    return choice


def _busy(load: float) -> bool:
    """More runnable threads than cores: a matmul timed now measures the sharing, not the CPU."""
    return load > (os.cpu_count() or 1)


def _remeasure(hit: dict, load: float) -> bool:
    """A cached rate measured on a busy machine (perf/mfu would divide by a fraction of the real peak) is measured
    again once the load has fallen to half of what it was and below the core count; the better rates are kept.
    An entry that does not say its load (written before rlkit stored it) is measured again once, when idle: one
    such entry held a quarter of this CPU's bf16 rate and made `perf/mfu` read 1.18."""
    then = hit.get("load_avg")
    if then is None:
        return not _busy(load)
    return _busy(then) and not _busy(load) and load < then / 2


def _store(path: Path, key: str, choice: PrecisionChoice, load: float) -> None:
    data = _read(path)
    data[key] = {k: v for k, v in asdict(choice).items() if k in ("fp32_gflops", "bf16_gflops", "dtype", "isa")}
    data[key]["load_avg"] = round(load, 2)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


@functools.cache
def auto_cpu_dtype() -> torch.dtype:
    """`param_dtype: auto` on CPU, decided once per process and logged at info with the numbers and the ISA: the
    user sees it once, in the resource plan's compute-dtype row (`plan_row`, measured at the workers' threads),
    not again from each worker and the driver."""
    choice = choose()
    log.info("%s", choice.line())
    return choice.torch_dtype


def plan_row(param_dtype: str, device: str, threads: int | None = None) -> str:
    """The resource plan's compute-dtype cell: what `param_dtype` resolves to on `device` and, for `auto` on CPU,
    why. `threads`: the workers' torch threads (`trainer.cpus_per_worker`), so the driver measures (once per
    machine, if nothing is cached) what the workers will then read from the cache; `trainer.device: auto`
    counts as CPU without CUDA."""
    gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if param_dtype != "auto":
        return param_dtype
    if gpu:
        return "auto -> bfloat16 (GPU)"
    choice = choose(threads=threads)
    return f"auto -> {choice.line().removeprefix('CPU compute dtype ')}"


def resolved_param_dtype(param_dtype: str, device: str, threads: int | None = None) -> str:
    """What `param_dtype` resolves to on `device` (the dtype `plan_row` shows, without the why)."""
    if param_dtype != "auto":
        return param_dtype
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return "bfloat16"
    return choose(threads=threads).dtype
