from pathlib import Path

from rlkit.config.load import preset_names, schema_keys
from rlkit.trainer.run.run_config import reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_config_reference_is_current():
    assert DOC.read_text() == reference(), "run: python -m rlkit.trainer.run.run_config > docs/config.md"


def test_every_key_is_documented():
    text = reference()
    for key in schema_keys():
        assert f"`{key}`" in text


def test_presets_exist():
    assert {"grpo", "ppo", "rloo", "reinforce_pp", "remax", "dapo"} <= set(preset_names())
