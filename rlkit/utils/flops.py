"""Model FLOPs of a step and the peak they are compared with (`perf/mfu`).

FLOPs count the matmuls of a decoder-only transformer (the standard estimate used for MFU):
per token, 2 FLOPs per weight of every projection (attention q/k/v/o, the MLP, the LM head;
not the embedding lookup), plus attention scores and the weighted sum, 4 * layers * heads *
head_dim per (query, key) pair, with causal attention over the token's own sequence. A
backward pass costs twice its forward, so a trained token costs 3x a scored one.

What `perf/mfu` counts: the tokens the step trained on (3 forwards each, times ppo_epochs)
and the tokens it scored without gradient (old log-probs, reference), both only the valid
(non-pad) tokens. Generation is not counted (it is bound by memory bandwidth, not matmul
throughput). The peak is, on GPU, the device's spec-sheet dense peak for the compute dtype
(`GPU_PEAK_TFLOPS`); on CPU this machine's measured matmul rate for the dtype the actor computes in, at
the workers' thread count: the precision probe's measurement (cached per machine), or a bench/peak.py
file named by $RLKIT_PEAK_FILE. The run summary names the peak and where it came from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import torch

from rlkit.phases import PHASES

#: Dense (no sparsity) spec-sheet peak in TFLOP/s: name fragment -> {dtype: peak}. First match wins.
GPU_PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("GB200", {"bf16": 2500.0, "fp32": 80.0}),
    ("B200", {"bf16": 2250.0, "fp32": 80.0}),
    ("H200", {"bf16": 989.0, "fp32": 67.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.0, "fp32": 67.0}),
    ("H800", {"bf16": 989.0, "fp32": 67.0}),
    ("H20", {"bf16": 148.0, "fp32": 44.0}),
    ("A100", {"bf16": 312.0, "fp32": 19.5}),
    ("A800", {"bf16": 312.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.0, "fp32": 91.6}),
    ("L40", {"bf16": 181.0, "fp32": 90.5}),
    ("L4", {"bf16": 121.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp32": 31.2}),
    ("RTX 4090", {"bf16": 165.0, "fp32": 82.6}),
    ("RTX 3090", {"bf16": 71.0, "fp32": 35.6}),
    ("V100", {"bf16": 125.0, "fp32": 15.7}),  # fp16 tensor cores
    ("T4", {"bf16": 65.0, "fp32": 8.1}),  # fp16 tensor cores
]

#: A peak file written by bench/peak.py on this machine (`RLKIT_PEAK_FILE=bench/results/peak.json`) replaces the
#: precision probe's rates as the CPU peak; unset, the probe's cached measurement of this machine is used.
PEAK_FILE_ENV = "RLKIT_PEAK_FILE"
#: An unknown GPU (not in GPU_PEAK_TFLOPS): perf/mfu is then not meaningful and says so in its source.
UNKNOWN_GPU_TFLOPS = 100.0


# --------------------------------------------------------------- model FLOPs
def _cfg(config: Any, *names: str, default: Any = None) -> Any:
    """The first of `names` set on `config`, or on its `text_config` (a vision-language model's language model:
    its FLOPs are counted, the vision tower's are not)."""
    for part in (config, getattr(config, "text_config", None)):
        for n in names:
            value = getattr(part, n, None) if part is not None else None
            if value is not None:
                return value
    return default


def matmul_params_per_token(config: Any) -> int:
    """Weights touched by one token in the projections and the LM head (MoE: the active experts only)."""
    return _matmul_params(config, experts=_cfg(config, "num_experts_per_tok", default=None))


def matmul_params_total(config: Any) -> int:
    """All projection and LM-head weights (MoE: every expert); equals the per-token count for dense models."""
    return _matmul_params(config, experts=_cfg(config, "num_experts", "num_local_experts", "n_routed_experts",
                                                   default=None))


def _matmul_params(config: Any, experts: int | None) -> int:
    d = _cfg(config, "hidden_size", "n_embd", "d_model")
    layers = _cfg(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg(config, "num_attention_heads", "n_head")
    kv_heads = _cfg(config, "num_key_value_heads", default=heads)
    head_dim = _cfg(config, "head_dim", default=d // heads)
    vocab = _cfg(config, "vocab_size")
    ffn = _cfg(config, "intermediate_size", "n_inner", default=4 * d)
    if experts and _cfg(config, "num_experts_per_tok", default=None):
        ffn = _cfg(config, "moe_intermediate_size", default=ffn) * experts
    gated = _cfg(config, "hidden_act", "activation_function", default="silu") in ("silu", "swiglu", "gelu_pytorch_tanh",
                                                                                  "geglu")
    attn = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2  # q, o + k, v
    mlp = (3 if gated else 2) * d * ffn
    return int(layers * (attn + mlp) + d * vocab)


def attention_flops_per_pair(config: Any) -> int:
    """FLOPs per (query, key) pair over all layers: QK^T and the weighted sum of V."""
    d = _cfg(config, "hidden_size", "n_embd", "d_model")
    layers = _cfg(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _cfg(config, "num_attention_heads", "n_head")
    head_dim = _cfg(config, "head_dim", default=d // heads)
    return 4 * layers * heads * head_dim


def forward_flops(config: Any, lengths: Iterable[int]) -> float:
    """Forward FLOPs of sequences of these valid lengths (each attends causally within itself)."""
    dense = 2 * matmul_params_per_token(config)
    pair = attention_flops_per_pair(config)
    total = 0.0
    for n in lengths:
        n = int(n)
        total += dense * n + pair * n * (n + 1) / 2
    return total


def step_flops(config: Any, lengths: Iterable[int], train_passes: int = 1, score_passes: int = 0) -> float:
    """FLOPs of a step: `train_passes` forward+backward (3x) and `score_passes` no-grad forwards."""
    return forward_flops(config, lengths) * (3 * train_passes + score_passes)


# --------------------------------------------------------------- peak FLOP/s
def _dtype_key(dtype: torch.dtype | str) -> str:
    name = str(dtype).replace("torch.", "")
    return "fp32" if name in ("float32", "fp32", "tf32") else "bf16"


def gpu_peak_flops(device_name: str, dtype: torch.dtype | str) -> float | None:
    """Spec-sheet dense peak (FLOP/s) of one GPU, or None for an unknown device."""
    for fragment, peaks in GPU_PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return peaks[_dtype_key(dtype)] * 1e12
    return None


def load_cpu_peak(path: str | Path) -> dict | None:
    """bench/peak.py's JSON, None when absent or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def cpu_peak_flops(cores: float, dtype: torch.dtype | str, peak: dict) -> float | None:
    """Matmul peak (FLOP/s) of `cores` CPU cores from a bench/peak.py file; None if it lacks this dtype."""
    key = _dtype_key(dtype)
    per_core = max(peak.get(f"{key}_gflops_per_core") or 0.0,
                   (peak.get(f"{key}_gflops") or 0.0) / max(1, peak.get("cores") or 1))
    return per_core * 1e9 * cores if per_core else None


def peak_flops(device: str, workers: int, dtype: torch.dtype | str, cores_per_worker: float = 1.0,
               device_name: str | None = None) -> tuple[float, str]:
    """Peak FLOP/s of the whole run and where it came from, for the summary ("spec sheet: <gpu>", ...).

    On CPU: this machine's matmul rate at the workers' thread count for the dtype in use -- the precision
    probe's measurement (rlkit/utils/cpu_precision.py, cached per machine), or bench/peak.py's file when
    $RLKIT_PEAK_FILE names one -- times the workers that fit on the cores."""
    key = _dtype_key(dtype)
    if device == "cuda":
        name = device_name or (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
        per = gpu_peak_flops(name, dtype)
        if per is not None:
            return per * workers, f"spec sheet: {name} {key}"
        return UNKNOWN_GPU_TFLOPS * 1e12 * workers, f"unknown GPU {name!r}: a guess of {UNKNOWN_GPU_TFLOPS:g} TFLOP/s"
    cores = min(workers * cores_per_worker, float(os.cpu_count() or 1))
    file = os.environ.get(PEAK_FILE_ENV)
    peak = load_cpu_peak(file) if file else None
    from_file = cpu_peak_flops(cores, dtype, peak) if peak else None
    if from_file:
        return from_file, f"{from_file / 1e9:.0f} GFLOP/s {key}, {cores:g} cores, from {file}"
    from rlkit.utils.cpu_precision import measured_rates

    threads = max(1, int(cores_per_worker))
    rates = measured_rates(threads)
    per_worker = (rates.fp32_gflops if key == "fp32" else rates.bf16_gflops) * 1e9
    total = per_worker * cores / threads
    return total, (f"{total / 1e9:.0f} GFLOP/s {key} = {cores / threads:g} x {per_worker / 1e9:.0f} at {threads} "
                   f"thread(s), this CPU's matmul rate ({rates.reason}, precision probe)")


def mfu(flops: float, seconds: float, peak: float) -> float:
    return flops / max(seconds, 1e-9) / max(peak, 1.0)


class MFUMeter:
    """`perf/mfu` of RL steps: FLOPs of the passes a step ran over its valid tokens / (step time x peak)."""

    def __init__(self, model_config: Any, peak: float, source: str, actor_epochs: int = 1, critic_epochs: int = 1):
        self.model_config, self.peak, self.source = model_config, peak, source
        self.actor_epochs, self.critic_epochs = actor_epochs, critic_epochs

    @classmethod
    def for_run(cls, cfg: Any, model_path: str, gpu: bool, dtype: torch.dtype) -> MFUMeter:
        """The meter of a run config; `dtype` is the actor's compute dtype (the peak depends on it)."""
        from transformers import AutoConfig

        model = cfg.actor_rollout_ref.model
        t = cfg.trainer
        peak, source = peak_flops("cuda" if gpu else "cpu", t.nnodes * t.n_gpus_per_node, dtype, t.cpus_per_worker)
        epochs = cfg.actor_rollout_ref.actor.ppo_epochs
        model_config = AutoConfig.from_pretrained(model_path, trust_remote_code=model.trust_remote_code)
        return cls(model_config, peak, source, epochs, cfg.critic.ppo_epochs or epochs)

    def step_flops(self, attention_mask: torch.Tensor, phases: Collection[str]) -> float:
        """FLOPs of the phases a step ran (`StepResult.phases`: "ref", "update_actor", ...) over these rows'
        valid tokens. Each phase's kind is declared in rlkit/phases.py (`Phase.flops`): "forward" = one no-grad
        forward, "train" = a forward and a backward per epoch of its role; the others run no counted matmuls."""
        ran = [PHASES[p] for p in phases if p in PHASES]
        scored = sum(1 for p in ran if p.flops == "forward")
        epochs = {"actor": self.actor_epochs, "critic": self.critic_epochs}
        trained = sum(epochs[c.role] for p in ran if p.flops == "train" for c in p.calls)
        return step_flops(self.model_config, attention_mask.sum(-1).tolist(), trained, scored)

    def __call__(self, flops: float, seconds: float) -> float:
        return mfu(flops, seconds, self.peak)
