"""`rlkit model list|pull|info` exit codes and output, offline, on tiny models."""

from __future__ import annotations

from typer.testing import CliRunner

from rlkit_cli.main import app

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, list(args))
    result.text = " ".join(result.output.split())  # rich wraps long lines at the test terminal width
    return result


def test_help_has_examples():
    result = invoke("model", "--help")
    assert result.exit_code == 0 and "rlkit model pull" in result.output
    for command in ("list", "pull", "info"):
        sub = invoke("model", command, "--help")
        assert sub.exit_code == 0 and "Example" in sub.output, command


def test_pull_gguf_then_list_and_info(tiny_gguf, cache_dir):
    result = invoke("model", "pull", str(tiny_gguf[0]), "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    assert "gguf (converted)" in result.output
    again = invoke("model", "pull", str(tiny_gguf[0]), "--cache-dir", str(cache_dir))
    assert again.exit_code == 0 and "gguf (cached)" in again.output
    listing = invoke("model", "list", "--cache-dir", str(cache_dir))
    assert listing.exit_code == 0, listing.output
    assert "smollm2-135m-instruct" in listing.output and "tiny-llama" in listing.output
    info = invoke("model", "info", str(tiny_gguf[0]), "--cache-dir", str(cache_dir))
    assert info.exit_code == 0, info.output
    for expected in ("parameters", "layers", "2", "vocab", "262", "BF16", "chat template", "yes"):
        assert expected in info.text, expected


def test_info_on_hf_folder(tiny_hf_folder, cache_dir):
    result = invoke("model", "info", str(tiny_hf_folder), "--cache-dir", str(cache_dir))
    assert result.exit_code == 0 and "local folder" in result.output


def test_bad_spec_exits_1(tmp_path, cache_dir):
    result = invoke("model", "pull", str(tmp_path / "missing.gguf"), "--cache-dir", str(cache_dir))
    assert result.exit_code == 1 and "no such file or folder" in result.text
    (tmp_path / "empty").mkdir()
    result = invoke("model", "info", str(tmp_path / "empty"))
    assert result.exit_code == 1 and "config.json" in result.text


def test_empty_cache_list(cache_dir):
    result = invoke("model", "list", "--cache-dir", str(cache_dir))
    assert result.exit_code == 0 and "not pulled" in result.output and "empty" in result.output
