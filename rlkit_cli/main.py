"""Entry point of the `rlkit` CLI.

Command groups live in `rlkit_cli/commands/<name>.py`, each exposing
`register(app)`. They are discovered here so adding a command never touches
this file.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

from rlkit.utils.quiet import quiet_process

quiet_process()  # before any command imports torch/vLLM: their log levels are read at import (RLKIT_VERBOSE=1: all)

from rlkit import __version__  # noqa: E402
from rlkit_cli import commands, end_loading_guard  # noqa: E402
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
end_loading_guard()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
