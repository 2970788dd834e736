"""`Batch`: the exchange format between the driver and the workers.

A Batch holds tensors that share their first dimension, numpy object arrays
for non-tensor data (raw prompts, ground truth, tool kwargs) with the same
length, and a free-form `meta` dict (config flags, metrics). Every operation
keeps the three in step so a row never loses its raw fields on the way through
the pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

METRICS_KEY = "metrics"


def _as_object_array(values: Any) -> np.ndarray:
    """Turn a list/array into a 1-d numpy object array without numpy splitting nested lists."""
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    values = list(values)
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


class Batch:
    """Rows of tensors + non-tensor arrays + meta. `len(batch)` is the row count."""

    __slots__ = ("tensors", "non_tensors", "meta")

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.non_tensors: dict[str, np.ndarray] = {
            k: _as_object_array(v) for k, v in (non_tensors or {}).items()
        }
        self.meta: dict[str, Any] = dict(meta or {})
        self._check()

    # ------------------------------------------------------------------ basics
    def _check(self) -> None:
        lengths = {f"tensor '{k}'": v.shape[0] if v.dim() else None for k, v in self.tensors.items()}
        lengths.update({f"non-tensor '{k}'": len(v) for k, v in self.non_tensors.items()})
        for name, n in lengths.items():
            if n is None:
                raise ValueError(f"Batch: {name} is a 0-d tensor; every entry needs a batch dimension")
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}={v}" for k, v in lengths.items())
            raise ValueError(f"Batch: entries disagree on the batch size ({detail}); all must share dim 0")

    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def keys(self) -> list[str]:
        return list(self.tensors) + list(self.non_tensors)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __repr__(self) -> str:
        t = {k: (tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in self.tensors.items()}
        return f"Batch(len={len(self)}, tensors={t}, non_tensors={list(self.non_tensors)}, meta={list(self.meta)})"

    def __getitem__(self, item: Any) -> Any:
        """`batch["key"]` returns one entry; an int/slice/index list returns a row selection."""
        if isinstance(item, str):
            if item in self.tensors:
                return self.tensors[item]
            if item in self.non_tensors:
                return self.non_tensors[item]
            raise KeyError(f"Batch has no key '{item}'; keys: {self.keys()}")
        if isinstance(item, int):
            item = slice(item, item + 1 if item != -1 else None)
        if isinstance(item, slice):
            return Batch(
                {k: v[item] for k, v in self.tensors.items()},
                {k: v[item] for k, v in self.non_tensors.items()},
                self.meta,
            )
        return self.index(item)

    def __setitem__(self, key: str, value: Any) -> None:
        n = len(self) if self.keys() else None
        if isinstance(value, torch.Tensor):
            if n is not None and value.shape[0] != n:
                raise ValueError(f"Batch: cannot set '{key}' with {value.shape[0]} rows on a batch of {n}")
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            arr = _as_object_array(value)
            if n is not None and len(arr) != n:
                raise ValueError(f"Batch: cannot set '{key}' with {len(arr)} rows on a batch of {n}")
            self.tensors.pop(key, None)
            self.non_tensors[key] = arr

    # --------------------------------------------------------------- selection
    def select(self, keys: Iterable[str] | None = None, meta_keys: Iterable[str] | None = None) -> Batch:
        """A new Batch with only `keys` (tensor or non-tensor names); tensors are shared, not copied."""
        keys = list(keys) if keys is not None else self.keys()
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"Batch.select: missing keys {missing}; available: {self.keys()}")
        meta = self.meta if meta_keys is None else {k: self.meta[k] for k in meta_keys}
        return Batch(
            {k: self.tensors[k] for k in keys if k in self.tensors},
            {k: self.non_tensors[k] for k in keys if k in self.non_tensors},
            meta,
        )

    def pop(self, keys: Iterable[str]) -> Batch:
        """Remove `keys` from this batch and return them as a new Batch (meta is shared)."""
        keys = list(keys)
        out = self.select(keys)
        for k in keys:
            self.tensors.pop(k, None)
            self.non_tensors.pop(k, None)
        return out

    def index(self, idx: Any) -> Batch:
        """Rows at `idx` (list, numpy array, bool mask or tensor), in that order."""
        if isinstance(idx, torch.Tensor):
            idx_t = idx
        else:
            idx_t = torch.as_tensor(np.asarray(idx))
        if idx_t.dtype == torch.bool:
            if idx_t.shape[0] != len(self):
                raise ValueError(f"Batch.index: mask has {idx_t.shape[0]} rows, batch has {len(self)}")
            idx_t = idx_t.nonzero(as_tuple=True)[0]
        idx_t = idx_t.long()
        idx_np = idx_t.numpy()
        return Batch(
            {k: v[idx_t.to(v.device)] for k, v in self.tensors.items()},
            {k: v[idx_np] for k, v in self.non_tensors.items()},
            self.meta,
        )

    def reorder(self, idx: Any) -> None:
        """Permute the rows in place."""
        out = self.index(idx)
        if len(out) != len(self):
            raise ValueError(f"Batch.reorder: index has {len(out)} rows, batch has {len(self)}")
        self.tensors, self.non_tensors = out.tensors, out.non_tensors

    # ------------------------------------------------------------- combination
    def union(self, other: Batch) -> Batch:
        """Merge keys of `other` into this batch (in place, returned). Conflicting keys are an error."""
        if self.keys() and other.keys() and len(self) != len(other):
            raise ValueError(f"Batch.union: lengths differ ({len(self)} vs {len(other)})")
        for k, v in other.tensors.items():
            if k in self.tensors and not (
                self.tensors[k] is v or (self.tensors[k].shape == v.shape and torch.equal(self.tensors[k], v))
            ):
                raise ValueError(f"Batch.union: tensor '{k}' exists on both sides with different values")
            self.tensors[k] = v
        for k, v in other.non_tensors.items():
            if k in self.non_tensors and not _object_arrays_equal(self.non_tensors[k], v):
                raise ValueError(f"Batch.union: non-tensor '{k}' exists on both sides with different values")
            self.non_tensors[k] = v
        for k, v in other.meta.items():
            if k == METRICS_KEY and k in self.meta:
                self.meta[k] = _merge_metrics([self.meta[k], v])
            elif k in self.meta and not _values_equal(self.meta[k], v):
                raise ValueError(f"Batch.union: meta '{k}' differs ({self.meta[k]!r} vs {v!r})")
            else:
                self.meta[k] = v
        return self

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Stack rows of several batches. Meta is taken from the first; `meta['metrics']` are merged."""
        batches = [b for b in batches]
        if not batches:
            raise ValueError("Batch.concat: nothing to concatenate")
        first = batches[0]
        for i, b in enumerate(batches[1:], start=1):
            if set(b.tensors) != set(first.tensors) or set(b.non_tensors) != set(first.non_tensors):
                raise ValueError(
                    f"Batch.concat: batch {i} has keys {sorted(b.keys())}, batch 0 has {sorted(first.keys())}"
                )
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors}
        meta = {k: v for k, v in first.meta.items() if k != METRICS_KEY}
        metric_dicts = [b.meta[METRICS_KEY] for b in batches if METRICS_KEY in b.meta]
        if metric_dicts:
            meta[METRICS_KEY] = _merge_metrics(metric_dicts)
        return Batch(tensors, non_tensors, meta)

    def chunk(self, chunks: int) -> list[Batch]:
        """Split into exactly `chunks` equal parts; the length must divide (see pad_to_divisor)."""
        n = len(self)
        if chunks <= 0 or n % chunks:
            raise ValueError(f"Batch.chunk: {n} rows do not split into {chunks} equal chunks; pad_to_divisor first")
        size = n // chunks
        return [self[i * size : (i + 1) * size] for i in range(chunks)]

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of `size` rows (the last may be shorter)."""
        if size <= 0:
            raise ValueError(f"Batch.split: size must be positive, got {size}")
        return [self[i : i + size] for i in range(0, len(self), size)]

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Repeat rows: interleave gives a,a,b,b; tile gives a,b,a,b."""
        n = len(self)
        if interleave:
            idx = np.repeat(np.arange(n), times)
        else:
            idx = np.tile(np.arange(n), times)
        return self.index(idx)

    def pad_to_divisor(self, divisor: int) -> tuple[Batch, int]:
        """Append copies of leading rows so len divides `divisor`; returns (batch, pad_size)."""
        n = len(self)
        pad = (-n) % divisor
        if pad == 0:
            return self, 0
        if n == 0:
            raise ValueError("Batch.pad_to_divisor: cannot pad an empty batch")
        idx = np.concatenate([np.arange(n), np.arange(pad) % n])
        return self.index(idx), pad

    def unpad(self, pad_size: int) -> Batch:
        return self if pad_size == 0 else self[: len(self) - pad_size]

    # ---------------------------------------------------------------- utility
    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.non_tensors, self.meta)

    def clone(self) -> Batch:
        return Batch(
            {k: v.clone() for k, v in self.tensors.items()},
            {k: v.copy() for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    def equals(self, other: Batch, atol: float = 0.0) -> bool:
        """Same keys, same values (tensors within `atol`), same meta."""
        if set(self.tensors) != set(other.tensors) or set(self.non_tensors) != set(other.non_tensors):
            return False
        for k, v in self.tensors.items():
            o = other.tensors[k]
            if v.shape != o.shape or v.dtype != o.dtype:
                return False
            if atol == 0.0 or not v.is_floating_point():
                if not torch.equal(v, o):
                    return False
            elif not torch.allclose(v, o, atol=atol, rtol=0.0):
                return False
        for k, v in self.non_tensors.items():
            if not _object_arrays_equal(v, other.non_tensors[k]):
                return False
        return _values_equal(self.meta, other.meta)

    def __eq__(self, other: object) -> bool:  # pragma: no cover - thin wrapper
        return isinstance(other, Batch) and self.equals(other)

    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        """Tensors travel as numpy arrays so Ray ships them out-of-band (zero-copy, no per-tensor pickles)."""
        packed = {}
        for k, v in self.tensors.items():
            v = v.detach()
            if v.device.type != "cpu":
                v = v.cpu()
            dtype = str(v.dtype).replace("torch.", "")
            if v.dtype == torch.bfloat16:
                arr = v.contiguous().view(torch.int16).numpy()
            else:
                arr = v.contiguous().numpy()
            packed[k] = (dtype, arr)
        return {"tensors": packed, "non_tensors": self.non_tensors, "meta": self.meta}

    def __setstate__(self, state: dict[str, Any]) -> None:
        tensors = {}
        for k, (dtype, arr) in state["tensors"].items():
            t = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
            if dtype == "bfloat16":
                t = t.view(torch.bfloat16)
            tensors[k] = t
        self.tensors = tensors
        self.non_tensors = state["non_tensors"]
        self.meta = state["meta"]


def _merge_metrics(dicts: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """Metrics from several shards: each key maps to the list of all reported values."""
    merged: dict[str, list] = {}
    for d in dicts:
        for k, v in d.items():
            vals = v if isinstance(v, list) else [v]
            merged.setdefault(k, []).extend(vals)
    return merged


def _values_equal(a: Any, b: Any) -> bool:
    try:
        result = a == b
        if isinstance(result, bool):
            return result
        return bool(np.all(result))
    except Exception:
        return False


def _object_arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if len(a) != len(b):
        return False
    return all(_values_equal(x, y) for x, y in zip(a, b))
