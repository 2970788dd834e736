"""One-line messages for the errors a user causes (bad paths, full disks, broken files).

`describe(exc)` returns the line the CLI prints instead of a traceback, or None for an
error it does not recognise (a bug: its traceback is shown). Formatters are registered per
exception type (in `FORMATTERS`, under the type's qualified name) and looked up along the type's
MRO, so a new kind of error is one function.
The file an error is about is named: from the exception itself (`OSError.filename`) or, for
errors that do not carry it (UnicodeDecodeError, JSONDecodeError, a damaged checkpoint),
from the open file or path in the innermost frame of the traceback.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from rlkit.errors import UserError
from rlkit.registry import Registry

Formatter = Callable[[BaseException], "str | None"]
#: exception type's qualified name (`type_key`) -> its formatter
FORMATTERS: Registry[Formatter] = Registry("error formatter")
MAX_SCAN_BYTES = 512 << 20  # files larger than this are not re-read to find the bad line


def type_key(cls: type) -> str:
    """A type's registry name: `builtins.OSError`, `json.decoder.JSONDecodeError`."""
    return f"{cls.__module__}.{cls.__qualname__}"


def formatter(*types: type) -> Callable[[Formatter], Formatter]:
    def deco(fn: Formatter) -> Formatter:
        for t in types:
            FORMATTERS.add(type_key(t), fn)
        return fn

    return deco


def describe(exc: BaseException) -> str | None:
    """The user-facing line for `exc`, or None when it is not a user-facing error."""
    for cls in type(exc).__mro__:
        key = type_key(cls)
        if key in FORMATTERS:
            msg = FORMATTERS.get(key)(exc)
            if msg is not None:
                return msg
    return None


# ------------------------------------------------------------------ which file


def _frames(exc: BaseException) -> list[FrameType]:
    """The traceback's frames, innermost first."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def _open_file(value: object) -> Path | None:
    if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
        return Path(value.name)  # type: ignore[attr-defined]
    return None


def _path(value: object) -> Path | None:
    if isinstance(value, (str, os.PathLike)) and 0 < len(os.fspath(value)) < 4096:
        try:
            path = Path(os.fspath(value)).expanduser()
            return path if path.exists() else None
        except (OSError, ValueError, TypeError):
            return None
    return None


def file_in_traceback(exc: BaseException) -> Path | None:
    """The file `exc` is most likely about: an open file in the innermost frame that has one, else a path."""
    frames = _frames(exc)
    for probe in (_open_file, _path):
        for frame in frames:
            for value in list(frame.f_locals.values()):
                found = probe(value)
                if found is not None:
                    return found
    return None


# ------------------------------------------------------------------ OSError family

#: errno -> what to do about it
ERRNO_FIXES: dict[int, str] = {
    errno.ENOENT: "check the path",
    errno.EEXIST: "remove it or choose another path",
    errno.EACCES: "check its permissions, or choose a path you can write to",
    errno.EPERM: "check its permissions, or choose a path you can write to",
    errno.EROFS: "choose a path on a writable disk",
    errno.ENOSPC: "free some space or choose a path on another disk",
    errno.EDQUOT: "free some space or choose a path on another disk",
    errno.EISDIR: "give the path of a file",
    errno.ENOTDIR: "a part of the path is a file; check the path",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n)",
    errno.ENOTEMPTY: "empty it or choose another path",
}


@formatter(OSError)
def _os_error(exc: BaseException) -> str:
    assert isinstance(exc, OSError)
    if exc.errno is None:  # e.g. transformers' "config file ... is not a valid JSON file": a sentence already
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    what = exc.strerror or os.strerror(exc.errno)
    names = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    if not names:  # a failed write/flush on an open file carries no name: find the file
        found = file_in_traceback(exc)
        names = [str(found)] if found else []
    where = " -> ".join(names) if names else "a file"
    fix = ERRNO_FIXES.get(exc.errno)
    return f"{where}: {what.lower()}" + (f"; {fix}" if fix else "")


# ------------------------------------------------------------------ text and JSON


def bad_text_line(path: Path, encoding: str) -> tuple[int, int] | None:
    """(line, column) of the first byte of `path` that does not decode as `encoding`."""
    try:
        if path.stat().st_size > MAX_SCAN_BYTES:
            return None
        data = path.read_bytes()
        data.decode(encoding)
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        return data.count(b"\n", 0, err.start) + 1, err.start - line_start + 1
    except (OSError, LookupError):
        return None
    return None


@formatter(UnicodeDecodeError)
def _unicode(exc: BaseException) -> str:
    assert isinstance(exc, UnicodeDecodeError)
    byte = f"byte 0x{exc.object[exc.start]:02x}" if exc.start < len(exc.object) else "a byte"
    path = file_in_traceback(exc)
    fix = "save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE > NEW`)"
    if path is None:
        return f"a file is not valid {exc.encoding} text ({byte}: {exc.reason}); {fix}. --traceback shows which"
    where = bad_text_line(path, exc.encoding) if path.is_file() else None
    at = f" line {where[0]} column {where[1]}" if where else ""
    return f"{path}{at}: not valid {exc.encoding} text ({byte}: {exc.reason}); {fix}"


@formatter(json.JSONDecodeError)
def _json(exc: BaseException) -> str:
    assert isinstance(exc, json.JSONDecodeError)
    path = file_in_traceback(exc)
    where = f"{path} line {exc.lineno} column {exc.colno}" if path else f"JSON at line {exc.lineno}"
    return f"{where}: not valid JSON ({exc.msg}); fix the file, or re-create it (a model folder: download it again)"


# ------------------------------------------------------------------ checkpoints

#: modules whose failure while reading a file means "this checkpoint file is damaged"
CHECKPOINT_READERS = ("torch/serialization.py", "torch/distributed/checkpoint", "safetensors")
#: markers of a damaged/partial checkpoint in RuntimeError messages from torch.load
CHECKPOINT_MARKERS = ("PytorchStreamReader", "zip archive", "unexpected EOF", "storage has wrong byte size",
                      "Error while deserializing", "incomplete metadata", "checkpoint")


def _from_checkpoint_reader(exc: BaseException) -> bool:
    return any(any(m in f.f_code.co_filename.replace(os.sep, "/") for m in CHECKPOINT_READERS) for f in _frames(exc))


def _root_cause(exc: BaseException) -> BaseException:
    """DCP's CheckpointException wraps each rank's failure as (exception, frames): the first one."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        first = first[0] if isinstance(first, tuple) else first
        if isinstance(first, BaseException):
            return first
    return exc


def _checkpoint_message(exc: BaseException) -> str:
    cause = _root_cause(exc)
    text = (str(cause).strip().splitlines() or [""])[0].split(". ")[0][:160] or "empty or truncated"
    path = file_in_traceback(exc)
    return (f"{path or 'a checkpoint or weights file'}: cannot load it ({type(cause).__name__}: {text}); the file is "
            "damaged or incomplete (an interrupted save, copy or download): use an earlier global_step_N "
            "checkpoint, or copy/download it again")


def _checkpoint(exc: BaseException) -> str | None:
    """Unpickling/EOF/zip errors count only when raised inside a checkpoint reader (torch.load, DCP)."""
    if not _from_checkpoint_reader(exc):
        return None
    if type(exc) is RuntimeError and not any(m in str(exc) for m in CHECKPOINT_MARKERS):
        return None
    return _checkpoint_message(exc)


formatter(pickle.UnpicklingError, EOFError, RuntimeError)(_checkpoint)


def _register_optional() -> None:
    """Error types of heavy packages, registered when they are already imported (they always mean a bad file)."""
    import sys

    dcp = sys.modules.get("torch.distributed.checkpoint")
    st = sys.modules.get("safetensors")
    for module, name in ((dcp, "CheckpointException"), (st, "SafetensorError")):
        if module is not None and hasattr(module, name) and type_key(getattr(module, name)) not in FORMATTERS:
            FORMATTERS.add(type_key(getattr(module, name)), _checkpoint_message)


# ------------------------------------------------------------------ ours


@formatter(UserError)
def _user(exc: BaseException) -> str:
    return str(exc)


def describe_any(exc: BaseException) -> str | None:
    """`describe` after registering the optional types (call at error time, when they are imported)."""
    _register_optional()
    return describe(exc)
