"""Pre-flight checks of the data files against the trainer that reads them, and the supervised trainers' pre-flight
(`rlkit train sft` / `dpo`): every problem one line naming the key, the file and the fix, found before Ray starts.

Each trainer reads its files with a layout of its own (FILE_CHECKS: SFT conversations, DPO preference pairs), in
any of the formats `rlkit.data.schema.read_table` reads (parquet, .jsonl, .json); a step takes
`data.train_batch_size` rows and the loader drops a last partial batch, so fewer rows than one batch is no run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

IMAGES = "images"  # verl's image column (rlkit/data/images.py)


def batch_rows_problem(rows: int | None, batch: int, key: str, what: str, multiple: int = 1) -> str | None:
    """The problem of `rows` training rows for batches of `batch` (None: enough, or not known)."""
    if rows is None or rows >= batch:
        return None
    fit = rows // multiple * multiple
    lower = (f"lower {key} to {fit} or less" + (f" (a multiple of the {multiple} workers)" if multiple > 1 else "")
             if fit > 0 else f"give at least {multiple} rows")
    return (f"{key}={batch} is more than the {rows} {what} in data.train_files: each step takes {key} of them and "
            f"a last partial batch is dropped (drop_last), so no step would run; {lower}, or add rows")


def _sft_problems(table: Any, path: Path, data: Any) -> list[str]:
    from rlkit.data.schema import data_columns
    from rlkit.data.sft_dataset import no_layout_message, sft_layout

    names = data_columns(table)
    if sft_layout(names, data) is None:
        return [f"{path}: {no_layout_message(names, data)}"]
    if IMAGES in names:  # the trainer would drop them and fine-tune on the text alone
        return [f"{path}: column '{IMAGES}' holds images, and rlkit's SFT trainer reads text only (images are for RL "
                "with a vision-language model, docs/vlm.md); drop the column to fine-tune on the text"]
    return []


def _preference_problems(table: Any, path: Path, data: Any) -> list[str]:
    from rlkit.data.preference_schema import validate_preference_table

    errors = [p for p in validate_preference_table(table) if p.is_error]
    if not errors:
        return []
    more = f" (and {len(errors) - 1} more; see `rlkit data inspect {path}`)" if len(errors) > 1 else ""
    return [f"{path}: {errors[0]}{more}"]


#: the trainer -> what its files must hold, (table, path, data section) -> problems
FILE_CHECKS: dict[str, Callable[[Any, Path, Any], list[str]]] = {"sft": _sft_problems, "dpo": _preference_problems}
WHAT = {"sft": "conversations", "dpo": "preference pairs"}


def check_supervised_files(cfg: Any, kind: str, problems: list[str]) -> tuple[int, int | None]:
    """Read every data file as the `kind` trainer will; returns (files, training rows or None when unreadable)."""
    from rlkit.data.dataset import expand_files
    from rlkit.data.schema import read_table

    d, check = cfg.data, FILE_CHECKS[kind]
    count, train_rows = 0, None
    for name, limit in (("train_files", d.train_max_samples), ("val_files", d.val_max_samples)):
        value = getattr(d, name)
        if not value:
            continue
        try:
            paths = expand_files(value)
        except UserError as exc:
            problems.append(f"data.{name}: {exc}")
            continue
        rows = 0
        for path in paths:
            if not path.is_file():
                problems.append(f"data.{name}: {path} does not exist; make one with `rlkit data gsm8k --format sft`, "
                                "`rlkit data messages FILE.jsonl` or `rlkit data pairs`")
                rows = None
                continue
            count += 1
            try:
                table = read_table(path)
            except UserError as exc:
                problems.append(f"data.{name}: {exc}")
                rows = None
                continue
            found = check(table, path, d)
            problems.extend(f"data.{name}: {p}" for p in found)
            if rows is not None:
                rows = None if found else rows + table.num_rows
        if name == "train_files" and rows is not None:
            train_rows = min(rows, limit) if limit is not None and limit > 0 else rows
    return count, train_rows


def supervised_preflight(cfg: Any, kind: str, allow_download: bool = False) -> list[str]:
    """`rlkit train sft|dpo`'s pre-flight: the data files (format, layout, rows against data.train_batch_size), the
    model (resolved without a download in a dry run; its positions against data.max_length), the checkpoint folder
    and the trackers. UserError listing every problem; the notes otherwise."""
    from rlkit.config.checks import world_size
    from rlkit.models.resolve import resolve_model_path
    from rlkit.trainer.run.preflight_engine import length_problem
    from rlkit.utils.fs_checks import writable_dir_problem
    from rlkit.utils.tracking import missing_tracker_packages

    problems: list[str] = []
    files, rows = check_supervised_files(cfg, kind, problems)
    d = cfg.data
    problem = batch_rows_problem(rows, d.train_batch_size, "data.train_batch_size", WHAT[kind], world_size(cfg))
    if problem:
        problems.append(problem)
    notes = [f"{files} data file(s)" + (f", {rows} training {WHAT[kind]}" if rows is not None else "")]
    spec = cfg.model.path
    try:
        local = Path(spec).expanduser().is_dir()
        model = Path(resolve_model_path(spec)) if allow_download or local else None
    except UserError as exc:
        problems.append(f"model.path: {exc}")
        model = None
    notes.append(f"model {model or f'{spec} (resolved at start)'}")
    if model is not None:
        _, note = length_problem(model, d.max_length, "data.max_length", engine=False)
        notes.extend([note] if note else [])
    problem = writable_dir_problem(cfg.trainer.default_local_dir)
    if problem is not None:
        problems.append(f"trainer.default_local_dir: {problem}; choose a writable folder")
    problems.extend(missing_tracker_packages(cfg.trainer.logger))
    if problems:
        head = "pre-flight check failed: " if len(problems) == 1 else f"pre-flight check found {len(problems)} " \
            "problems:\n  "
        raise UserError(head + "\n  ".join(problems))
    return notes
