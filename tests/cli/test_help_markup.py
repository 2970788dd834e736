"""Every command's --help shows its help text's brackets (`[a,b]`, `[actor.update_policy:step=2]`): the CLI renders
help as rich markup, where an unescaped `[...]` that is not a style would vanish."""

from __future__ import annotations

import re

import click
import typer
from rich.errors import StyleSyntaxError
from rich.style import Style
from typer.testing import CliRunner

from rlkit_cli.main import app


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = []
    for name, cmd in group.commands.items():
        found.append(((*path, name), cmd))
        if isinstance(cmd, click.Group):
            found.extend(_commands(cmd, (*path, name)))
    return found


def _literal_brackets(text: str) -> list[str]:
    """`[...]` groups of a help text that are no style tag, as the user sees them (an escaped `\\[` shows as `[`)."""
    groups = []
    for match in re.finditer(r"(\\?)\[([^\[\]]+)\]", text or ""):
        escaped, tag = match.groups()
        try:
            if not escaped and (tag.startswith("/") or Style.parse(tag)):
                continue
        except StyleSyntaxError:
            pass
        groups.append(f"[{tag}]")
    return groups


def test_help_keeps_literal_brackets():
    root = typer.main.get_command(app)
    runner = CliRunner()
    checked = 0
    for path, cmd in _commands(root):  # type: ignore[arg-type]
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        wanted = [g for t in texts for g in _literal_brackets(t)]
        if not wanted:
            continue
        shown = " ".join(runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output.split())
        for group in wanted:
            assert group in shown, f"`rlkit {' '.join(path)} --help` lost {group}"
            checked += 1
    assert checked >= 1
