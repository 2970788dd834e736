from pathlib import Path

from rlkit.trainer.config import preset_names, schema_keys
from rlkit.trainer.config_doc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_config_reference_is_current():
    assert DOC.read_text() == render(), "run: python -m rlkit.trainer.config_doc > docs/config.md"


def test_every_key_is_documented():
    text = render()
    for key in schema_keys():
        assert f"`{key}`" in text


def test_presets_exist():
    assert {"grpo", "ppo", "rloo", "reinforce_pp", "remax", "dapo"} <= set(preset_names())
