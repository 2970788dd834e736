"""`actor_rollout_ref.model.use_torch_compile`: each decoder layer compiled with torch.compile (inductor).

Regional compilation: the repeated block is compiled, not the whole model, so one graph serves every
layer (same code, parameters passed as inputs) and compile time does not grow with depth. Shapes are
dynamic from the first call (`dynamic=True`): a micro-batch's length changes every step (packed
rows, trimmed padding), and one symbolic-shape graph avoids a recompile per length. The layer's
`forward` is compiled, not the module call, so FSDP2's hooks (gather, reshard) stay outside the graph
and the parameter names (checkpoints, weight sync) are unchanged. The varlen attention's per-sequence
loop runs eagerly inside (`torch.compiler.disable`): the compiled regions are the projections, norms,
rotary embedding and MLP around it.

The compiled code is cached on disk by torch itself (inductor's FX-graph and AOT-autograd caches), keyed by the
graph, the shapes' symbols and the versions: a second run of the same model loads it instead of compiling
(measured on SmolLM2: the first update's extra cost 27 s cold -> 4 s warm). rlkit points that cache at
$RLKIT_CACHE_DIR/inductor (default ~/.cache/rlkit/inductor) unless $TORCHINDUCTOR_CACHE_DIR is set: torch's own
default lives under /tmp, which machines clear.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from rlkit.utils.cpu_precision import CACHE_ENV

log = logging.getLogger(__name__)
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_dir() -> Path:
    """Where compiled layers are cached across runs: $TORCHINDUCTOR_CACHE_DIR, set to rlkit's cache when unset."""
    if not os.environ.get(INDUCTOR_CACHE_ENV):
        root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rlkit"
        os.environ[INDUCTOR_CACHE_ENV] = str(Path(root) / "inductor")
    return Path(os.environ[INDUCTOR_CACHE_ENV])


#: `use_torch_compile: auto` compiles models with at least this many parameters. Measured (docs/performance.md):
#: SmolLM2-135M, 16 GRPO steps, 2 cores: 4% less wall time with a cold compile cache, 11% with a warm one; the
#: README's 2-layer tiny model, 150 steps: 66% more (its steps are too small to win the compile time back).
AUTO_MIN_PARAMS = 50_000_000


def wanted(setting: bool | str, model: torch.nn.Module) -> bool:
    """`use_torch_compile` for this model: true/false as given; auto by the model's size (AUTO_MIN_PARAMS)."""
    if setting != "auto":
        return bool(setting)
    params = sum(p.numel() for p in model.parameters())
    log.info("use_torch_compile=auto: %s (%.0fM parameters; compiled from %.0fM)", "on" if params >= AUTO_MIN_PARAMS
             else "off", params / 1e6, AUTO_MIN_PARAMS / 1e6)
    return params >= AUTO_MIN_PARAMS


def compile_layers(layers: list[torch.nn.Module]) -> int:
    """Compile each layer's forward in place; returns how many. No layers (an unknown architecture): a warning."""
    if not layers:
        log.warning("use_torch_compile: no repeated decoder layers found in this model; running it eagerly")
        return 0
    log.info("use_torch_compile: %d layers, compiled code cached in %s", len(layers), inductor_cache_dir())
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    return len(layers)
