"""wandb out of the box: without an API key (or a network) the run logs offline, for real, under the log dir,
and one line says how to upload it later."""

from __future__ import annotations

import logging

import pytest

from rlkit.utils.tracking import Tracking
from rlkit.utils.wandb_mode import choose_mode, has_api_key


@pytest.fixture
def no_wandb_key(tmp_path, monkeypatch):
    """No key anywhere: WANDB_API_KEY unset, an empty netrc, wandb's own folders inside tmp_path."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "RLKIT_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return netrc


def test_mode_follows_the_key_and_an_explicit_wandb_mode(no_wandb_key, monkeypatch):
    assert not has_api_key() and choose_mode()[0] == "offline"
    no_wandb_key.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")  # what `wandb login` stores
    assert has_api_key()
    monkeypatch.setenv("RLKIT_OFFLINE", "1")
    assert choose_mode() == ("offline", "RLKIT_OFFLINE=1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert choose_mode()[0] == "disabled"  # the user's own setting wins


def test_without_a_key_the_run_is_written_offline_with_one_line(no_wandb_key, tmp_path, caplog):
    log_dir = tmp_path / "logs"
    with caplog.at_level(logging.WARNING, logger="rlkit.tracking"):
        with Tracking(["wandb"], "proj", "exp", log_dir=log_dir, config={"lr": 1e-6}) as tracking:
            tracking.log({"actor/pg_loss": 0.5}, step=1)
            tracking.log({"actor/pg_loss": 0.25}, step=2)
    runs = sorted((log_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "an offline run folder with its log file"
    assert (runs[0] / "files").is_dir()
    lines = [r.getMessage() for r in caplog.records if "wandb" in r.getMessage()]
    assert lines == [f"wandb: no API key (WANDB_API_KEY or `wandb login`): logging offline to {runs[0]}; "
                     f"upload it later with `wandb sync {runs[0]}`"]
