"""Per-phase peak memory (rlkit.utils.memory_peak): each phase's peak is its own, not the process's lifetime peak."""

from __future__ import annotations

import io

import torch
from rich.console import Console

from rlkit.trainer.run.run_summary import phase_memory_rows
from rlkit.utils.console_tracker import ConsoleTracker, console_group
from rlkit.utils.memory_peak import PhasePeaks, note, phase_metrics, rss_gb, tensor_gb, use_sink
from rlkit.utils.tracker_base import RunInfo

MB = 2**20 / 2**30  # one MiB in GB


def test_each_phase_reports_its_own_peak_after_a_bigger_one():
    peaks = PhasePeaks()
    start = rss_gb()
    with peaks.measure("big"):
        big = torch.ones(512 * 2**20 // 4)  # 512 MiB, touched
        del big
    with peaks.measure("small"):
        small = torch.ones(16 * 2**20 // 4)
        del small
    got = peaks.pop()
    assert got["big"]["rss_peak_gb"] >= start + 500 * MB
    # the kernel's peak was reset before "small": it is far below "big"'s, which the lifetime peak would repeat
    assert got["small"]["rss_peak_gb"] < got["big"]["rss_peak_gb"] - 400 * MB
    assert peaks.pop() == {}  # popped: the next step starts empty


def test_repeated_calls_keep_the_max_and_workers_merge_by_max():
    peaks = PhasePeaks()
    for size_mb in (256, 8):
        with peaks.measure("update_actor"):
            x = torch.ones(size_mb * 2**20 // 4)
            del x
    first = peaks.pop()["update_actor"]["rss_peak_gb"]
    merged = phase_metrics([{"update_actor": {"rss_peak_gb": first}}, {"update_actor": {"rss_peak_gb": first + 1}},
                            {"generate_sequences": {"rss_peak_gb": 0.5}, "rollout": {"weights_gb": 9.0}}])
    # memory/worker/rss_peak_gb: the largest worker's peak over its calls (a role's noted sizes are not calls)
    assert merged == {"memory/update_actor/rss_peak_gb": first + 1, "memory/generate_sequences/rss_peak_gb": 0.5,
                      "memory/rollout/weights_gb": 9.0, "memory/worker/rss_peak_gb": first + 1}


def test_each_call_reports_its_growth_and_roles_note_what_they_hold():
    """`rss_growth_gb`: how far a call rose above its start (a weight sync's copies in flight, an update's
    activations); `note`: a role's size of something it holds, into the same record (the worker host's)."""
    peaks = PhasePeaks()
    use_sink(peaks)
    try:
        with peaks.measure("sync_weights"):
            x = torch.ones(256 * 2**20 // 4)  # 256 MiB in flight, then freed
            del x
            note("rollout", "weights_gb", 0.25)
        note("rollout", "weights_gb", 0.125)  # the max over the step is kept
    finally:
        use_sink(None)
    note("rollout", "weights_gb", 99.0)  # no worker host: dropped
    got = peaks.pop()
    assert 240 * MB < got["sync_weights"]["rss_growth_gb"] < got["sync_weights"]["rss_peak_gb"]
    assert got["rollout"] == {"weights_gb": 0.25}
    assert tensor_gb([torch.zeros(2**20), None, torch.zeros(2**19, dtype=torch.bfloat16)]) == 5 * MB


def test_console_and_run_summary_show_a_cell_per_phase(tmp_path):
    metrics = {"memory/update_actor/rss_peak_gb": 4.25, "memory/generate_sequences/rss_peak_gb": 3.5,
               "memory/validate/rss_peak_gb": 3.0, "timing_s/step": 1.0, "memory/driver/rss_peak_gb": 0.5,
               "memory/worker/rss_peak_gb": 4.25, "memory/actor/optimizer_state_gb": 1.0}
    assert console_group("memory/update_actor/rss_peak_gb") == ("peak RSS GB", "update_actor")
    assert console_group("memory/update_actor/cuda_peak_allocated_gb") == ("peak CUDA GB", "update_actor")
    out = io.StringIO()
    tracker = ConsoleTracker(RunInfo("p", "e", tmp_path, 2, {}), console=Console(file=out, width=200))
    tracker.log(metrics, 1)
    line = next(row for row in out.getvalue().splitlines() if row.strip().startswith("peak RSS GB"))
    assert "generate_sequences 3.5" in line and "update_actor 4.25" in line
    rows = dict(phase_memory_rows(metrics))
    assert rows == {"peak RSS per process (GB)": "driver 0.50, worker 4.25",
                    "peak RSS per phase (GB)": "generate_sequences 3.50, update_actor 4.25, validate 3.00"}
    assert "optimizer_state_gb" not in out.getvalue()  # the parts go to the trackers' files, not the console
