"""A user's sampler or dataset class named in the config as verl names it: `pkg://dotted.module` (an importable
module), a `.py` file path, or a dotted module, plus the class name (verl's `data.sampler.class_path/class_name`,
`data.custom_cls.path/name`). What is missing is one line naming the key."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rlkit.errors import UserError


def load_user_object(path: str, name: str | None, key: str) -> Any:
    """The object `name` of the module at `path`; `key` (e.g. data.sampler) names the config keys in errors."""
    if not name:
        raise UserError(f"{key}: a class name is needed beside the path {path!r}")
    module = _module(str(path), key)
    obj = getattr(module, name, None)
    if obj is None:
        raise UserError(f"{key}: {path} has no {name!r}; check the class name")
    return obj


def _module(path: str, key: str) -> Any:
    if path.startswith("pkg://"):
        return _import(path.removeprefix("pkg://"), key, path)
    file = Path(path).expanduser()
    if path.endswith(".py") or file.exists():
        if not file.is_file():
            raise UserError(f"{key}: no file {path}; point it at the .py file that defines the class")
        name = f"rlkit_user_{hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except ImportError as exc:
            sys.modules.pop(name, None)
            raise UserError(f"{key}: {path} imports what is not installed ({exc})") from None
        return module
    return _import(path, key, path)


def _import(dotted: str, key: str, shown: str) -> Any:
    """The module, from the working directory first where it holds the package: verl is started as `python -m`
    from the folder its `pkg://` paths are relative to (its own examples name `pkg://tests.utils...` of its
    repository)."""
    here, top = Path.cwd(), dotted.split(".")[0]
    if ((here / top).is_dir() or (here / f"{top}.py").is_file()) and sys.path[:1] != [str(here)]:
        sys.path.insert(0, str(here))
    try:
        return importlib.import_module(dotted)
    except ImportError as exc:
        raise UserError(f"{key}: cannot import {shown} ({exc}); check the module path") from None
