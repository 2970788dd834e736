"""Where a sharded model's weights come from: every rank's own read of the checkpoint, or rank 0's alone.

Every rank reading the whole model in fp32 costs the host world x the model (~224 GB for a 7B model on 8
GPUs, issue 49 defect 6). With the rank-0 load, rank 0 reads the checkpoint, the other ranks build the same
module on the meta device (shapes, no storage), and once FSDP2 has sharded it `set_model_state_dict` broadcasts
rank 0's full state dict one tensor at a time, each rank keeping its own shards; the buffers (rotary `inv_freq`:
not in the state dict) are broadcast after. What rank 0 sends is its module right before sharding, so a LoRA
adapter's initial values and a value head's fresh one are the same on every rank, as the per-rank load makes
them with one seed.

On by default where it pays (CUDA, world size > 1); `RLKIT_RANK0_LOAD=1` forces it anywhere a group of more
than one rank shards the model (the CPU tests), `=0` turns it off.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

RANK0_LOAD_ENV = "RLKIT_RANK0_LOAD"


def rank0_load_wanted(device: torch.device, world: int) -> bool:
    """The rank-0 load: only with more than one rank; on CUDA unless the environment says 0, elsewhere if it says 1."""
    forced = os.environ.get(RANK0_LOAD_ENV, "")
    if forced not in ("", "0", "1"):
        raise ValueError(f"{RANK0_LOAD_ENV}={forced!r}: use 1 (rank 0 loads, the others receive) or 0 (every rank)")
    if world <= 1 or forced == "0":
        return False
    return forced == "1" or device.type == "cuda"


def load_model(model_path: str, config: Any, auto_class: str | None, value_head: bool, rank0_only: bool,
               **kwargs: Any) -> torch.nn.Module:
    """The transformers model FSDPModel wraps: `auto_class` (the reward model's sequence classifier), a value
    model (a token classifier with one label), or the config's causal LM (a VLM's image-text one)."""
    import transformers

    from rlkit.models.vision import causal_lm_class

    if auto_class is not None:
        cls = getattr(transformers, auto_class)
    elif value_head:
        config.num_labels = 1
        # no dropout before the value head (transformers' default is 0.1): in train mode it would make the
        # update's values differ from compute_values' and the gradient depend on how rows are micro-batched
        config.classifier_dropout = 0.0
        cls = transformers.AutoModelForTokenClassification
    else:
        cls = getattr(transformers, causal_lm_class(config))
    return load_pretrained(cls, model_path, config, rank0_only, **kwargs)


def load_pretrained(cls: Any, model_path: str, config: Any, rank0_only: bool, **kwargs: Any) -> torch.nn.Module:
    """The model of `cls` (a transformers Auto class) with its weights (rank 0, or every rank without
    `rank0_only`), or its shape alone on the meta device (the other ranks: they never open the weight files)."""
    if not rank0_only or dist.get_rank() == 0:
        return cls.from_pretrained(model_path, config=config, **kwargs)
    with torch.device("meta"):
        return cls.from_config(config, **kwargs)


def on_meta(model: torch.nn.Module) -> bool:
    """Whether this rank holds the model's shape alone (a rank other than 0 of the rank-0 load, before `fill`)."""
    return any(p.device.type == "meta" for p in model.parameters())


class Rank0Weights:
    """Rank 0's full state dict, taken right before sharding, until `fill` sends it to every rank's shards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.rank = dist.get_rank()
        self.state: dict[str, torch.Tensor] = model.state_dict() if self.rank == 0 else {}

    def place(self, model: torch.nn.Module, device: torch.device, offloaded: bool) -> None:
        """After sharding: rank 0's shards go to the device as a per-rank load's do; the meta ranks' get storage
        there (on the host where FSDP2 offloads them), filled by `fill`."""
        if self.rank == 0:
            if not offloaded:
                model.to(device)
            return
        model.to_empty(device=torch.device("cpu") if offloaded else device)

    def fill(self, model: torch.nn.Module) -> None:
        """Broadcast rank 0's tensors into every rank's shards, then its buffers (a collective); frees the copy."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, self.state, options=options)
        self.state = {}
        with torch.no_grad():
            for _, buffer in model.named_buffers():
                dist.broadcast(buffer, src=0)
