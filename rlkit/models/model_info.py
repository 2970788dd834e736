"""What a rollout backend needs to know about a model folder, and the weight-name contract.

Both backends stop on the same token ids and pad with the same id, and both
accept exactly the HF parameter names of the model (what the trainer's FSDP
state dict gathers to). `WeightStream` checks an incoming (name, tensor) stream
against those names while it flows, so a sync that loads nothing, loads a
wrong name or a wrong shape fails loudly instead of silently keeping old weights.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from rlkit.utils.tokens import pad_token_id

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def special_token_ids(model_path: str | Path, tokenizer=None) -> tuple[list[int], int]:
    """(stop ids, pad id): tokenizer EOS + generation_config EOS; pad: the tokenizer's, else generation_config's,
    else the first stop id (rlkit.utils.tokens.pad_token_id)."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(str(model_path))
    stop = _as_list(tokenizer.eos_token_id)
    gen_pad = None
    try:
        gen = GenerationConfig.from_pretrained(str(model_path))
        stop += _as_list(gen.eos_token_id)
        gen_pad = gen.pad_token_id
    except OSError:  # no generation_config.json
        pass
    stop = list(dict.fromkeys(stop))
    return stop, pad_token_id(tokenizer, gen_pad, *stop[:1], where=f"{model_path}: the tokenizer")


class WeightNames:
    """Parameter names and shapes of a model, with tied names grouped (any one of a group suffices).

    `checkpoint=True`: the names of the checkpoint/engine layout (rlkit.models.weight_layout), which
    differs from the in-memory one for mixture-of-experts models; a stream of in-memory tensors is then
    converted on the fly, so the engine receives exactly the names its loader expects.
    """

    def __init__(self, model: torch.nn.Module, checkpoint: bool = False) -> None:
        from rlkit.models.weight_layout import WeightLayout

        self.layout = WeightLayout(model) if checkpoint else None
        if self.layout is not None and self.layout.identity:
            self.layout = None
        tied: dict[int, list[str]] = {}
        memory_shapes: dict[str, torch.Tensor] = {}
        for name, tensor in model.state_dict(keep_vars=True).items():
            memory_shapes[name] = tensor
            tied.setdefault(id(tensor), []).append(name)
        self.shapes: dict[str, torch.Size] = {}
        self.groups: list[list[str]] = []
        for members in tied.values():
            converted = {m: self._convert(m, memory_shapes[m]) for m in members}
            for shapes in converted.values():
                self.shapes.update(shapes)
            if len(members) > 1:  # tied parameters: any one of the names suffices
                self.groups.append([n for shapes in converted.values() for n in shapes])
            else:  # one in-memory tensor may become several (one per expert): each is required
                self.groups.extend([n] for n in converted[members[0]])

    def nbytes(self, dtype: torch.dtype) -> int:
        """The model's weights in `dtype`, tied tensors once."""
        return sum(self.shapes[group[0]].numel() for group in self.groups) * dtype.itemsize

    def _convert(self, name: str, tensor: torch.Tensor) -> dict[str, torch.Size]:
        if self.layout is None:
            return {name: tensor.shape}
        return {n: t.shape for n, t in self.layout.tensor_to_checkpoint(name, tensor.detach()).items()}

    @classmethod
    def from_folder(cls, model_path: str | Path, checkpoint: bool = True) -> WeightNames:
        """Names of the model in `model_path` (by default in its checkpoint layout, what an engine loads),
        built on the meta device (no weights read)."""
        import transformers
        from transformers import AutoConfig

        from rlkit.models.vision import causal_lm_class

        config = AutoConfig.from_pretrained(str(model_path))
        with torch.device("meta"):
            model = getattr(transformers, causal_lm_class(config)).from_config(config)
        return cls(model, checkpoint=checkpoint)

    def stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> WeightStream:
        """Validate (and, in checkpoint layout, convert) an in-memory (name, tensor) stream."""
        if self.layout is not None:
            named_tensors = self.layout.to_checkpoint(named_tensors)
        return WeightStream(self, named_tensors)


class WeightStream:
    """Pass-through iterator that validates names/shapes and counts bytes; call `finish()` after consuming.

    Unknown names and wrong shapes are dropped (never handed to the engine) and
    reported by `finish()`, together with names that never arrived.
    """

    def __init__(self, names: WeightNames, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.names = names
        self._source = iter(named_tensors)
        self.seen: set[str] = set()
        self.unknown: list[str] = []
        self.bad_shape: list[str] = []
        self.nbytes = 0
        self.count = 0
        self._start = time.perf_counter()

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._source:
            expected = self.names.shapes.get(name)
            if expected is None:
                self.unknown.append(name)
                continue
            if tuple(tensor.shape) != tuple(expected):
                self.bad_shape.append(f"{name} {tuple(tensor.shape)} != {tuple(expected)}")
                continue
            if name in self.seen:
                self.unknown.append(f"{name} (sent twice)")
                continue
            self.seen.add(name)
            self.nbytes += tensor.numel() * tensor.element_size()
            self.count += 1
            yield name, tensor

    def missing(self) -> list[str]:
        return [g[0] for g in self.names.groups if not self.seen.intersection(g)]

    def finish(self) -> dict[str, float]:
        """Raise ValueError listing every problem; else return {bytes, tensors, seconds}."""
        problems = []
        if self.unknown:
            problems.append(f"unknown names {self.unknown[:8]}{' ...' if len(self.unknown) > 8 else ''}")
        if self.bad_shape:
            problems.append(f"wrong shapes {self.bad_shape[:8]}")
        missing = self.missing()
        if missing:
            problems.append(f"{len(missing)} missing names {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if problems:
            raise ValueError(
                "update_weights: the tensors do not match the rollout model (" + "; ".join(problems) + "). "
                "Send the full HF-named state dict of the same architecture; the engine now holds a mix of "
                "old and new weights."
            )
        return {"bytes": self.nbytes, "tensors": self.count, "seconds": time.perf_counter() - self._start}
