"""Write one split to parquet with an explicit schema, never clobbering data by accident.

An explicit pyarrow schema (not pandas inference) pins every type: an all-null column
or an int-looking ground truth would otherwise come out typed differently per dataset.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlkit.data.schema import validate_table
from rlkit.errors import UserError


def refuse_overwrite(paths: Iterable[Path], force: bool) -> None:
    """Without --force, existing outputs are an error (checked before any work is done)."""
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        names = ", ".join(p.name for p in existing)
        raise UserError(
            f"{existing[0].parent}: {names} already exist; pass --force to overwrite or choose another --out"
        )


def prepare_out_dir(out: Path) -> Path:
    out = out.expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file, expected a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot create the directory ({exc.strerror}); choose another --out") from None
    return out


def write_split(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> pa.Table:
    """Build the table with `schema`, self-check it against the validator, write atomically."""
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise UserError(f"{path}: rows do not fit the schema ({exc})") from None
    errors = [p for p in validate_table(table) if p.is_error]
    if errors:  # a bug in a dataset module, not user input; still say where
        raise UserError(f"{path}: generated rows are invalid: {errors[0]}")
    return write_table(table, path)


def write_table(table: pa.Table, path: Path) -> pa.Table:
    """Write atomically: a crash never leaves a half-written file under the final name."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc}); check the disk and --out") from None
    finally:  # the cleanup must not raise a second error (on a read-only disk even unlink fails)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return table
