"""`param_dtype: auto` on CPU (rlkit/utils/cpu_precision.py): the ISA read from /proc/cpuinfo text, the
bf16-or-fp32 decision from handmade measurements (both outcomes, whatever this machine's ISA), the
per-machine cache and the override; one real (tiny) measurement."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rlkit.utils import cpu_precision as cp

AMX = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN4 = "model name\t: AMD EPYC 9654\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
AVX2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 fma avx2\nmodel name\t: AMD EPYC\nflags\t\t: fpu\n"


def test_read_isa_from_cpuinfo_text():
    amx = cp.read_isa(AMX, torch_capability="AVX512")
    assert amx.model == "Intel(R) Xeon(R) Platinum 8480+" and amx.bf16_hardware
    assert amx.flags == ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
    assert cp.read_isa(ZEN4, "AVX512").bf16_hardware
    avx2 = cp.read_isa(AVX2, "AVX2")
    assert avx2.flags == ("avx2",) and not avx2.bf16_hardware  # the first processor's flags
    assert avx2.describe() == "AMD EPYC [avx2; torch AVX2]"
    assert cp.read_isa().torch_capability == torch.backends.cpu.get_cpu_capability()  # this machine: no crash


@pytest.mark.parametrize(
    "fp32, bf16, want",
    [
        (200.0, 900.0, "bfloat16"),  # AMX: 4.5x
        (100.0, 130.0, "bfloat16"),  # exactly the margin
        (100.0, 125.0, "float32"),  # faster, but not by the margin: keep fp32's precision
        (46.0, 0.3, "float32"),  # AVX2: bf16 emulated, ~150x slower
    ],
)
def test_decide_by_measured_speedup(fp32, bf16, want):
    choice = cp.decide(fp32, bf16, cp.read_isa(AMX, "AVX512"), threads=4)
    assert choice.dtype == want and choice.torch_dtype == getattr(torch, want)
    assert choice.speedup == pytest.approx(bf16 / fp32)
    assert f"{choice.speedup:.2f}x" in choice.line() and "amx_bf16" in choice.line() and want in choice.line()


def test_flags_do_not_overrule_the_measurement():
    """An AMX CPU whose torch build did not use it measured slow: fp32; an AVX2 CPU that measured fast: bf16."""
    assert cp.decide(200.0, 150.0, cp.read_isa(AMX, "AVX512"), 4).dtype == "float32"
    assert cp.decide(50.0, 100.0, cp.read_isa(AVX2, "AVX2"), 4).dtype == "bfloat16"


def test_choose_measures_once_per_machine_and_thread_count(tmp_path, monkeypatch):
    monkeypatch.delenv(cp.OVERRIDE_ENV, raising=False)
    calls = []

    def fake_measure(threads):
        calls.append(threads)
        return (100.0, 250.0) if threads == 8 else (100.0, 40.0)

    isa = cp.read_isa(AMX, "AVX512")
    first = cp.choose(8, isa, tmp_path, fake_measure)
    assert (first.dtype, first.reason, calls) == ("bfloat16", "measured", [8])
    again = cp.choose(8, isa, tmp_path, fake_measure)
    assert (again.dtype, again.reason, again.bf16_gflops, calls) == ("bfloat16", "cached", 250.0, [8])
    one = cp.choose(1, isa, tmp_path, fake_measure)  # another thread count is another measurement
    assert (one.dtype, calls) == ("float32", [8, 1])
    other = cp.choose(8, cp.read_isa(AVX2, "AVX2"), tmp_path, fake_measure)  # another CPU too
    assert other.reason == "measured" and calls == [8, 1, 8]
    stored = json.loads((tmp_path / cp.CACHE_FILE).read_text())
    assert len(stored) == 3 and all(torch.__version__ in key for key in stored)
    monkeypatch.setenv(cp.CACHE_ENV, str(tmp_path))  # the cache dir from the environment
    assert cp.cache_path() == tmp_path / cp.CACHE_FILE
    assert cp.choose(8, isa, measure_fn=fake_measure).reason == "cached"


def test_a_rate_measured_on_a_busy_machine_is_measured_again_when_quieter(tmp_path):
    """perf/mfu divides by the cached rate: one timed while other work shared the cores would flatter every run
    after it, so it is re-measured once the load has fallen, keeping the better of the two."""
    isa, busy, quiet = cp.read_isa(AMX, "AVX512"), 4.0 * (os.cpu_count() or 1), 0.2
    rates = iter([(40.0, 180.0), (190.0, 800.0)])
    first = cp.measured_rates(2, isa, tmp_path, lambda t: next(rates), load_fn=lambda: busy)
    assert (first.reason, first.bf16_gflops) == ("measured", 180.0)
    assert cp.measured_rates(2, isa, tmp_path, lambda t: (0.0, 0.0), load_fn=lambda: busy).reason == "cached"
    again = cp.measured_rates(2, isa, tmp_path, lambda t: next(rates), load_fn=lambda: quiet)
    assert (again.reason, again.fp32_gflops, again.bf16_gflops) == ("measured", 190.0, 800.0)
    worse = cp.measured_rates(2, isa, tmp_path, lambda t: (1.0, 1.0), load_fn=lambda: quiet)
    assert (worse.reason, worse.bf16_gflops) == ("cached", 800.0)  # measured when quiet: trusted from now on


def test_override_env_skips_the_measurement(tmp_path, monkeypatch):
    def never(threads):
        raise AssertionError("measured despite the override")

    monkeypatch.setenv(cp.OVERRIDE_ENV, "bfloat16")
    choice = cp.choose(2, cp.read_isa(AVX2, "AVX2"), tmp_path, never)
    assert choice.dtype == "bfloat16" and cp.OVERRIDE_ENV in choice.line()
    monkeypatch.setenv(cp.OVERRIDE_ENV, "bf16")
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        cp.choose(2, cp.read_isa(AVX2, "AVX2"), tmp_path, never)


def test_real_measurement_is_positive_and_restores_threads():
    before = torch.get_num_threads()
    fp32, bf16 = cp.measure(1, size=128, tokens=64, repeats=1, rounds=1)
    assert fp32 > 0 and bf16 > 0 and torch.get_num_threads() == before


def test_fsdp_config_rejects_an_unknown_dtype():
    from rlkit.config.fsdp import FSDPConfig
    from rlkit.errors import UserError

    with pytest.raises(UserError, match="param_dtype='bf16'"):
        FSDPConfig(param_dtype="bf16")


def test_unwritable_cache_measures_without_failing(tmp_path, monkeypatch):
    monkeypatch.delenv(cp.OVERRIDE_ENV, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    choice = cp.choose(2, cp.read_isa(AVX2, "AVX2"), blocker / "cache", lambda threads: (50.0, 0.5))
    assert (choice.dtype, choice.reason) == ("float32", "measured")


def test_plan_row_names_the_resolved_dtype_and_why(monkeypatch):
    monkeypatch.setenv(cp.OVERRIDE_ENV, "float32")
    assert cp.plan_row("bfloat16", "cpu") == "bfloat16"
    assert cp.plan_row("auto", "cuda") == "auto -> bfloat16 (GPU)"
    row = cp.plan_row("auto", "cpu", threads=3)
    assert row.startswith("auto -> float32") and cp.OVERRIDE_ENV in row


def test_an_entry_without_its_load_is_measured_again_once_when_idle(tmp_path):
    """Entries written before rlkit stored the load say nothing of how busy the machine was: one held a quarter of
    the CPU's bf16 rate (perf/mfu read 1.18). Idle, it is measured again once; the better rates are kept."""
    isa, busy, quiet = cp.read_isa(AMX, "AVX512"), 4.0 * (os.cpu_count() or 1), 0.2
    key = cp.cache_key(isa, 2)
    (tmp_path / cp.CACHE_FILE).write_text(json.dumps({key: {"dtype": "bfloat16", "fp32_gflops": 38.7,
                                                             "bf16_gflops": 179.4, "isa": isa.describe()}}))
    assert cp.measured_rates(2, isa, tmp_path, lambda t: (0.0, 0.0), load_fn=lambda: busy).reason == "cached"
    again = cp.measured_rates(2, isa, tmp_path, lambda t: (183.8, 767.1), load_fn=lambda: quiet)
    assert (again.reason, again.bf16_gflops) == ("measured", 767.1)
    assert cp.measured_rates(2, isa, tmp_path, lambda t: (1.0, 1.0), load_fn=lambda: quiet).reason == "cached"
