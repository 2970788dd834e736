"""User-facing errors: one clear line, exit status 1, no traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from rlkit.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])
err_console = Console(stderr=True)
__all__ = ["UserError", "friendly_errors", "err_console"]


def friendly_errors(fn: F) -> F:
    """Turn UserError (and the usual bad-input exceptions) into a red line and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (UserError, FileNotFoundError, FileExistsError) as exc:
            err_console.print(f"[bold red]error:[/bold red] {exc}", soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]
