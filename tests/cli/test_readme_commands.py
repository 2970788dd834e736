"""The README's CLI table lists every command the CLI has, and its commands work from any directory."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from rlkit_cli.main import app

README = Path(__file__).resolve().parents[2] / "README.md"


def cli_commands() -> set[str]:
    """"data toy", "train", ...: every command a user can run."""
    root = typer.main.get_command(app)
    found = set()
    for name, cmd in root.commands.items():
        subs = getattr(cmd, "commands", None)
        found |= {f"{name} {sub}" for sub in subs} if subs else {name}
    return found


def readme_commands() -> set[str]:
    """Commands named in the first column of the README's CLI table (`rlkit data gsm8k\\|math` = two)."""
    section = README.read_text().split("## CLI", 1)[1].split("\n## ", 1)[0]
    found = set()
    for cell in re.findall(r"^\| `rlkit ([^`]+)` \|", section, re.M):
        words = cell.replace("\\|", "|").split()
        if not words[0].isidentifier():
            continue
        subs = words[1].split("|") if len(words) > 1 and words[1][0].islower() else []
        found |= {f"{words[0]} {s}" for s in subs} if subs else {words[0]}
    return found


def test_cli_table_lists_every_command():
    missing = cli_commands() - readme_commands()
    assert not missing, f"README.md CLI table lacks: {sorted(missing)}"
    from rlkit.trainer.run.trainers import TRAINERS

    trainers = {"train"} | {f"train {name}" for name in TRAINERS}  # `rlkit train sft`: a trainer, not a subcommand
    assert not readme_commands() - cli_commands() - trainers, "the table names commands the CLI does not have"


def test_readme_commands_work_from_any_directory():
    """`.venv/bin/rlkit` works only from the repository root; the README activates the venv once instead."""
    text = README.read_text()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    assert "source .venv/bin/activate" in blocks
    assert not re.search(r"^\s*\.venv/bin/", blocks, re.M), blocks
