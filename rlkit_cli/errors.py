"""User-facing errors: one clear line, exit status 1, no traceback.

What counts as a user's error (and its message) lives in `rlkit_cli.error_messages`:
UserError, the OSError family (missing file, permission, read-only or full disk...),
undecodable text, broken JSON, damaged checkpoints. Anything else is a bug and keeps its
traceback. `RLKIT_DEBUG=1` or `rlkit --traceback ...` prints the traceback of user errors too.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click
import typer
from rich.console import Console

from rlkit.errors import UserError
from rlkit_cli.error_messages import describe_any

F = TypeVar("F", bound=Callable[..., Any])
err_console = Console(stderr=True)
__all__ = ["friendly_errors", "err_console", "show_tracebacks", "TRACEBACK_ENV"]

TRACEBACK_ENV = "RLKIT_DEBUG"
_OFF = ("", "0", "off", "false", "no")
_forced = False  # set by `rlkit --traceback`


def show_tracebacks(value: bool | None = None) -> bool:
    """Whether user errors print their traceback; `value` sets it (the --traceback flag)."""
    global _forced
    if value is not None:
        _forced = value
    return _forced or os.environ.get(TRACEBACK_ENV, "").strip().lower() not in _OFF


def friendly_errors(fn: F) -> F:
    """Turn user errors (see rlkit_cli.error_messages) into a red line on stderr and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, KeyboardInterrupt, SystemExit,
                GeneratorExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            message = describe_any(exc)
            if message is None:
                raise  # not a user error: a bug, keep the traceback
            if show_tracebacks():
                err_console.print("".join(traceback.format_exception(exc)), markup=False, highlight=False,
                                  soft_wrap=True)
            err_console.print(f"[bold red]error:[/bold red] {_escape(message)}", soft_wrap=True)
            if not isinstance(exc, UserError) and not show_tracebacks():
                err_console.print(f"(rlkit --traceback ... or {TRACEBACK_ENV}=1 shows where it happened)", style="dim")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
