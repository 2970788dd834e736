"""Load a user's reward function from `custom_reward_function.path` / `.name`.

The function has the scorer signature `fn(response, ground_truth, extra_info, **kwargs)`
and returns a float or a dict with `score`; it may be `async def`. It also
receives `data_source=` when its signature accepts it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

DEFAULT_NAME = "compute_score"


def load_custom_fn(path: str | Path, name: str = DEFAULT_NAME) -> Callable[..., Any]:
    """Import `path` as a module and return its function `name`; a UserError names what is missing."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"custom_reward_function.path: file not found: {file}")
    if file.suffix != ".py":
        raise UserError(f"custom_reward_function.path: {file} is not a .py file")
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    module_name = f"rlkit_custom_reward_{file.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"custom_reward_function.path: cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so pickling (Ray) and dataclasses inside the file work
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        raise UserError(f"custom_reward_function.path: {file} line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise UserError(f"custom_reward_function.path: importing {file} failed: {exc!r}") from exc
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        found = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_"))
        what = "is not callable" if fn is not None else "not found"
        raise UserError(
            f"custom_reward_function.name: '{name}' {what} in {file}. Functions there: {', '.join(found) or 'none'}."
        )
    return fn


def accepts(fn: Callable[..., Any], kwarg: str) -> bool:
    """Whether `fn` can be called with keyword `kwarg` (named or via **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == kwarg or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
