"""Every recipe script in recipes/ is valid bash (`bash -n`): GPU recipes cannot run in CI, but must not rot."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.sh"))


def test_there_are_recipes():
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_recipe_script_parses(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
