"""RL training data: the parquet schema and its validator, the prompt dataset, collate, samplers.

Names are imported lazily: `rlkit data ...` (schema only) must not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "collate": "rlkit.data.collation",
    "left_pad": "rlkit.data.collation",
    "RLDataset": "rlkit.data.dataset",
    "expand_files": "rlkit.data.dataset",
    "ResumableSampler": "rlkit.data.sampler",
    "RLDataLoader": "rlkit.data.sampler",
    "REQUIRED_COLUMNS": "rlkit.data.schema",
    "ROLES": "rlkit.data.schema",
    "Problem": "rlkit.data.schema",
    "arrow_schema": "rlkit.data.schema",
    "ensure_valid": "rlkit.data.schema",
    "read_table": "rlkit.data.schema",
    "validate_table": "rlkit.data.schema",
    "TRUNCATION": "rlkit.data.truncation",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlkit.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
