"""`actor_rollout_ref.model.use_torch_compile`: each decoder layer compiled with torch.compile (inductor).

Regional compilation: the repeated block is compiled, not the whole model, so one graph serves every
layer (same code, parameters passed as inputs) and compile time does not grow with depth. Shapes are
dynamic from the first call (`dynamic=True`): a micro-batch's length changes every step (packed
rows, trimmed padding), and one symbolic-shape graph avoids a recompile per length. The layer's
`forward` is compiled, not the module call, so FSDP2's hooks (gather, reshard) stay outside the graph
and the parameter names (checkpoints, weight sync) are unchanged. The varlen attention's per-sequence
loop runs eagerly inside (`torch.compiler.disable`): the compiled regions are the projections, norms,
rotary embedding and MLP around it.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def compile_layers(layers: list[torch.nn.Module]) -> int:
    """Compile each layer's forward in place; returns how many. No layers (an unknown architecture): a warning."""
    if not layers:
        log.warning("use_torch_compile: no repeated decoder layers found in this model; running it eagerly")
        return 0
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    return len(layers)
