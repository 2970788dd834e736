"""Each phase of an rlkit GRPO step against the bound this machine's measured peak puts on it.

    .venv/bin/python bench/phase_bounds.py --peak bench/results/peak.json --report bench/results/vs_trl.json

`bench/vs_trl.py` prints this table after its comparison (rlkit rows), from `bench/peak.py`'s file measured on
the same machine and the step's own metrics (medians over the steps used). A bound is the time the phase's
unavoidable work takes at 100% of the measured peak, for the dtype that phase computes in:

  gen           prefill FLOPs at the matmul peak + one read of the engine's weights per decode step (the longest
                response's length) at the measured read bandwidth: decode at batch 16 is memory-bound
  old_log_prob  one forward over the batch's valid tokens (dense + causal attention FLOPs, rlkit.utils.flops)
  ref           the same forward in the reference's dtype
  update_actor  forward + backward (3x the forward) per epoch, plus AdamW reading/writing fp32 params, grads
                and two moments (16 bytes read + 12 written per parameter) at the copy bandwidth
  update_weights  the engine's weights written once at the copy bandwidth (read + write of each byte)

FLOPs count valid tokens only (`prompt_length/mean` + `response_length/mean` per row); padding is the
framework's own cost, so it shows in the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.utils.flops import forward_flops, matmul_params_per_token

BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2}


@dataclass(frozen=True)
class Peak:
    """A bench/peak.py measurement at the run's thread count: matmul FLOP/s per dtype and memory bandwidth."""

    fp32_flops: float
    bf16_flops: float
    read_bps: float
    copy_bps: float
    source: str

    @classmethod
    def from_file(cls, path: str | Path) -> Peak:
        d = json.loads(Path(path).read_text())
        where = f"{d.get('cpu', '?')}, measured {d.get('measured_at', '?')}, load {d.get('load_avg_1m', '?')}"
        return cls(d["fp32_gflops"] * 1e9, d["bf16_gflops"] * 1e9, d["read_gbs"] * 1e9, d["copy_gbs"] * 1e9,
                   f"{path} ({where})")

    def flops(self, dtype: str) -> float:
        return self.fp32_flops if BYTES[dtype] == 4 else self.bf16_flops


@dataclass(frozen=True)
class PhaseBound:
    phase: str
    measured_s: float
    bound_s: float
    what: str

    @property
    def ratio(self) -> float:
        return self.measured_s / self.bound_s if self.bound_s > 0 else float("nan")


def _median(rows: Iterable[Mapping[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def phase_bounds(model_config: Any, steps: list[Mapping[str, Any]], rows: int, peak: Peak, actor_dtype: str,
                 engine_dtype: str, epochs: int = 1) -> list[PhaseBound]:
    """The bound of every phase the steps' metrics timed (medians over `steps`, the trainer's metric rows)."""
    prompt = _median(steps, "prompt_length/mean") or 0.0
    resp = _median(steps, "response_length/mean") or 0.0
    longest = _median(steps, "response_length/max") or resp
    lengths = [prompt + resp] * rows
    fwd = forward_flops(model_config, lengths)
    params = matmul_params_per_token(model_config)
    out: list[PhaseBound] = []

    def add(phase: str, bound: float, what: str) -> None:
        measured = _median(steps, f"timing_s/{phase}")
        if measured is not None:
            out.append(PhaseBound(phase, measured, bound, what))

    prefill = forward_flops(model_config, [prompt] * rows) / peak.flops(engine_dtype)
    decode = longest * params * BYTES[engine_dtype] / peak.read_bps
    gen_key = "gen_only" if any("timing_s/gen_only" in s for s in steps) else "gen"
    add(gen_key, prefill + decode, f"prefill {prefill:.2f} s at the {engine_dtype} peak + {longest:.0f} decode "
        f"steps reading {params * BYTES[engine_dtype] / 1e6:.0f} MB of weights ({decode:.2f} s)")
    add("old_log_prob", fwd / peak.flops(actor_dtype), f"{fwd / 1e12:.2f} TFLOP forward, {actor_dtype}")
    add("ref", fwd / peak.flops(actor_dtype), f"{fwd / 1e12:.2f} TFLOP forward, {actor_dtype}")
    adam = params * 28 / peak.copy_bps
    add("update_actor", epochs * 3 * fwd / peak.flops(actor_dtype) + adam,
        f"{epochs * 3 * fwd / 1e12:.2f} TFLOP forward+backward, {actor_dtype}, + AdamW {adam:.2f} s")
    add("update_weights", 2 * params * BYTES[engine_dtype] / peak.copy_bps,
        f"{params * BYTES[engine_dtype] / 1e6:.0f} MB of {engine_dtype} weights copied once")
    return out


def table(bounds: list[PhaseBound], title: str) -> str:
    head = f"{'phase':16s} {'measured s':>10s} {'bound s':>8s} {'x bound':>8s}  what bounds it"
    lines = [title, head, "-" * len(head)]
    for b in bounds:
        lines.append(f"{b.phase:16s} {b.measured_s:10.2f} {b.bound_s:8.2f} {b.ratio:8.1f}  {b.what}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peak", required=True, help="bench/peak.py's JSON, measured on this machine")
    ap.add_argument("--report", required=True, help="bench/vs_trl.py's JSON")
    args = ap.parse_args()
    saved = json.loads(Path(args.report).read_text())
    for name, bounds in report_bounds(saved, Peak.from_file(args.peak)).items():
        print(table(bounds, f"{name}: phases against this machine's bound"), end="\n\n")


def report_bounds(saved: dict, peak: Peak) -> dict[str, list[PhaseBound]]:
    """The bound tables of every rlkit variant of a bench/vs_trl.py result that kept its raw metric rows."""
    from transformers import AutoConfig

    meta = saved["meta"]
    config = AutoConfig.from_pretrained(meta["model_dir"])
    out = {}
    for name, runs in saved.get("metrics", {}).items():
        steps = [row for run in runs for row in run if row.get("step", 0) >= 2]
        out[name] = phase_bounds(config, steps, meta.get("rows", 16), peak, meta["actor_dtype"], meta["engine_dtype"])
    return out


if __name__ == "__main__":
    main()
