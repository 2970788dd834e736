"""Entry point of the `rlkit` CLI.

Command groups live in `rlkit_cli/commands/<name>.py`, each exposing
`register(app)`. They are discovered here so adding a command never touches
this file.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType


def _interrupted_while_loading(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while the CLI's modules load: nothing has started, so one line and the shell's 130."""
    os.write(2, b"interrupted before the command started\n")  # os._exit flushes nothing
    os._exit(128 + signum)


_LOADING = threading.current_thread() is threading.main_thread()
_previous_sigint = signal.signal(signal.SIGINT, _interrupted_while_loading) if _LOADING else None

import importlib  # noqa: E402
import pkgutil  # noqa: E402

import typer  # noqa: E402

from rlkit.utils.quiet import quiet_process  # noqa: E402

quiet_process()  # before any command imports torch/vLLM: their log levels are read at import (RLKIT_VERBOSE=1: all)

from rlkit import __version__  # noqa: E402
from rlkit_cli import commands  # noqa: E402
from rlkit_cli.errors import show_tracebacks  # noqa: E402

app = typer.Typer(
    name="rlkit",
    help="RL post-training for LLMs. Example: [bold]rlkit data toy --out /tmp/toy[/bold]",
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"rlkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
    traceback: bool = typer.Option(
        False, "--traceback", help="On an error, print the traceback too (same as RLKIT_DEBUG=1)."
    ),
) -> None:
    """rlkit: GRPO/PPO/RLOO/DAPO post-training on a laptop CPU or a GPU cluster.

    Exit status: 0 on success, 1 on a user error (bad input, bad config), 2 on bad usage.
    """
    if traceback:
        show_tracebacks(True)


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(app)


_register_commands()
if _LOADING:
    signal.signal(signal.SIGINT, _previous_sigint)  # each command handles Ctrl-C its own way from here


def main() -> None:
    app()


if __name__ == "__main__":
    main()
