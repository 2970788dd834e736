"""What every experiment tracker shares: the `Tracker` protocol, the `RunInfo` it is built with, the
`TRACKERS` registry (names of `trainer.logger`) and the value reductions, so that all backends log
identical numbers.

A backend that needs a package declares it (`packages`, `install`); `import_backend` turns a failed import
into the same one-line UserError the pre-flight gives.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rlkit.errors import UserError
from rlkit.registry import Registry


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


@dataclasses.dataclass
class RunInfo:
    """What every backend is constructed with."""

    project: str
    experiment: str
    log_dir: Path
    total_steps: int | None
    config: dict[str, Any]


TRACKERS: Registry[type] = Registry("tracker", fill=("rlkit.utils.tracking",))

#: one validation generation as the trackers log it: {"input": str, "output": str, "score": float}
Generation = dict[str, Any]
GENERATION_COLUMNS = ("step", "input", "output", "score")


def importable(module: str) -> bool:
    """Whether `module` can be imported, without importing it (cheap enough for a pre-flight)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out as None
        return False


def tracker_names(backends: Sequence[str] | str) -> list[str]:
    """`trainer.logger` as a list: one name (`console`) or a list of names."""
    return [backends] if isinstance(backends, str) else [str(b) for b in backends]


def import_backend(module: str, tracker: type) -> Any:
    """The tracker's package, or the one-line UserError `missing_tracker_packages` gives."""
    try:
        return importlib.import_module(module)
    except ImportError:
        name = next((n for n in TRACKERS.names() if TRACKERS.get(n) is tracker), tracker.__name__)
        raise UserError(f"tracker '{name}' needs the {module} package: {tracker.install}, or drop it from "
                        "trainer.logger") from None


def generation_rows(samples: Sequence[Generation], step: int) -> list[list[Any]]:
    """The samples as table rows, in GENERATION_COLUMNS order."""
    return [[step, s.get("input"), s.get("output"), s.get("score")] for s in samples]


def to_float(value: Any) -> float | None:
    """Mean of a list/array/tensor, float of a scalar; None for empty or non-numeric values."""
    if value is None or isinstance(value, (str, bytes)):
        return None
    if isinstance(value, (bool, int, float)):
        return float(value)
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().float().cpu()
        return float(value.mean()) if value.numel() else None
    if isinstance(value, (list, tuple)):
        items = [v for v in (to_float(v) for v in value) if v is not None]
        return sum(items) / len(items) if items else None
    if hasattr(value, "dtype") and hasattr(value, "size"):  # numpy array or scalar
        try:
            return float(value.mean()) if value.size else None
        except (TypeError, ValueError):
            return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def to_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """What a tracker logs: one float per key (`to_float`: lists by their mean); non-numeric and empty values
    are dropped."""
    return {k: v for k, v in ((k, to_float(v)) for k, v in metrics.items()) if v is not None}


def plain_config(config: Any) -> dict[str, Any]:
    """A JSON-able dict from a dict, dataclass or OmegaConf config (for wandb/tensorboard/file)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            config = OmegaConf.to_container(config, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return json.loads(json.dumps(dict(config), default=str))

