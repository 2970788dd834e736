"""Where raw records come from: `--source PATH`, the Hugging Face hub, or a packaged copy.

The order is fixed (explicit path, then hub, then the offline copy) and the chosen
one is reported, so a user always knows which data a parquet was built from.
Every record keeps its location (file + line/row) for error messages.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rlkit.errors import UserError
from rlkit.models.hub import hub_endpoint, hub_offline, hub_reachable
from rlkit.registry import Registry

Located = list[tuple[int, dict[str, Any]]]  # (line or row number, record)
READERS: Registry = Registry("source file format")


@dataclass
class SplitRecords:
    """The raw records of one split, with where each came from."""

    split: str
    records: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    _locs: list[tuple[int, int]] = field(default_factory=list)  # (origin index, line/row number)

    def add(self, origin: str, located: Located) -> None:
        self.origins.append(origin)
        k = len(self.origins) - 1
        for number, record in located:
            self.records.append(record)
            self._locs.append((k, number))

    def where(self, i: int) -> str:
        k, number = self._locs[i]
        origin = self.origins[k]
        unit = "line" if origin.endswith(".jsonl") else "row"
        return f"{origin} {unit} {number}"


@dataclass
class Resolved:
    splits: dict[str, SplitRecords]
    description: str


@dataclass(frozen=True)
class HubDataset:
    repo: str
    config: str | None = None
    splits: tuple[str, ...] = ("train", "test")


# ------------------------------------------------------------------ file readers
@READERS.register(".jsonl")
def read_jsonl(path: Path) -> Located:
    out: Located = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path} line {number}: not valid JSON ({exc.msg}); fix or remove the line") from None
            if not isinstance(record, dict):
                raise UserError(f"{path} line {number}: expected a JSON object per line, got {type(record).__name__}")
            out.append((number, record))
    return out


@READERS.register(".parquet")
def read_parquet(path: Path) -> Located:
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise UserError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
    return list(enumerate(rows))


def read_file(path: Path) -> Located:
    if path.suffix not in READERS:
        raise UserError(f"{path}: unsupported source format '{path.suffix}'; use {' or '.join(READERS.names())}")
    located = READERS.get(path.suffix)(path)
    if not located:
        raise UserError(f"{path}: has no records; check the file")
    return located


# ------------------------------------------------------------------ local paths
def _split_files(directory: Path, split: str) -> list[Path]:
    """The first naming style that matches: train.jsonl, train.parquet, train-*.parquet (hub shards)."""
    for pattern in (f"{split}.jsonl", f"{split}.parquet", f"{split}-*.parquet", f"{split}-*.jsonl"):
        for base in ("", "*/"):
            found = sorted(directory.glob(base + pattern))
            if found:
                return found
    return []


def split_of_file(path: Path, splits: Sequence[str], default: str) -> str:
    """`test.jsonl` or `test-00000-of-00001.parquet` is the test split; anything else is `default`."""
    stem = path.name.split(".")[0].split("-")[0]
    return stem if stem in splits else default


def load_local(source: Path, splits: Sequence[str], split: str | None = None, default_split: str = "train") -> dict:
    """A directory holding `<split>.jsonl`/`.parquet` files, or one file (its split from --split or the name)."""
    source = source.expanduser()
    if not source.exists():
        raise UserError(f"--source {source}: no such file or directory")
    if source.is_dir():
        files = {s: _split_files(source, s) for s in splits}
        if not any(files.values()):
            names = ", ".join(f"{s}.jsonl" for s in splits)
            raise UserError(f"--source {source}: no split files found; expected {names} (or .parquet)")
    else:
        files = {split or split_of_file(source, splits, default_split): [source]}
    out = {}
    for name, paths in files.items():
        if paths:
            records = SplitRecords(name)
            for path in paths:
                records.add(str(path), read_file(path))
            out[name] = records
    return out


def packaged_dir(name: str) -> Path:
    """The offline copy shipped in `data_prep/assets/<name>`."""
    return Path(str(resources.files("data_prep.assets") / name))


# ------------------------------------------------------------------ the hub
def hub_unavailable_reason() -> str | None:
    """Why the hub cannot be used right now (cheapest checks first), or None."""
    if importlib.util.find_spec("datasets") is None:
        return "the `datasets` package is not installed"
    if hub_offline() or os.environ.get("HF_DATASETS_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "offline mode is set (RLKIT_OFFLINE / HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"
    if not hub_reachable():
        return f"{hub_endpoint()} is unreachable"
    return None


def load_hub(hub: HubDataset, timeout: float = 120.0) -> tuple[dict[str, SplitRecords] | None, str]:
    """(records per split, description) or (None, why not). Never raises, never hangs past `timeout`."""
    reason = hub_unavailable_reason()
    if reason:
        return None, reason
    result: dict[str, Any] = {}

    def fetch() -> None:
        try:
            import datasets

            out = {}
            for split in hub.splits:
                rows = datasets.load_dataset(hub.repo, hub.config, split=split).to_list()
                records = SplitRecords(split)
                records.add(f"hub:{hub.repo}/{split}", list(enumerate(rows)))
                out[split] = records
            result["splits"] = out
        except Exception as exc:  # any hub failure means: fall back
            result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    worker = threading.Thread(target=fetch, daemon=True)  # daemon: a stuck download cannot block exit
    worker.start()
    worker.join(timeout)
    if "splits" in result:
        return result["splits"], f"hub {hub.repo}" + (f" ({hub.config})" if hub.config else "")
    return None, result.get("error", f"the hub did not answer within {timeout:.0f}s")


def resolve(
    *,
    source: Path | None,
    splits: Sequence[str],
    split: str | None = None,
    default_split: str = "train",
    hub: HubDataset | None = None,
    use_hub: bool = True,
    packaged: str | None = None,
    dataset: str,
) -> Resolved:
    """Pick the source: --source, else the hub, else the packaged copy, else a UserError saying what to pass."""
    if source is not None:
        return Resolved(load_local(source, splits, split, default_split), f"--source {source}")
    why = "disabled by --no-hub" if hub and not use_hub else "no hub dataset"
    if hub is not None and use_hub:
        got, why = load_hub(hub)
        if got is not None:
            return Resolved(got, why)
    if packaged is not None:
        path = packaged_dir(packaged)
        return Resolved(load_local(path, splits), f"packaged copy {path} (hub not used: {why})")
    repo = f" {hub.repo}" if hub else ""
    raise UserError(
        f"{dataset}: no data. The hub dataset{repo} is not available ({why}) and no offline copy ships with rlkit; "
        "pass --source PATH (a .jsonl/.parquet file or a directory of split files)"
    )
