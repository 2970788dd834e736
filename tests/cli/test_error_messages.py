"""User errors end as one line naming the file and the fix, exit 1, no traceback; real conditions:
a read-only and a full file system (tmpfs in a private mount namespace), a file we may not read
(root without CAP_DAC_OVERRIDE, or a chmod'ed file), undecodable text, broken JSON in a model
folder, a damaged weights file. `--traceback` / RLKIT_DEBUG=1 add the traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import cli_env, rlkit_cmd

LATIN1_ROWS = (b'{"data_source": "openai/gsm8k", "response": "#### 4", "ground_truth": "4"}\n'
               b'{"data_source": "openai/gsm8k", "response": "caf\xe9 #### 4", "ground_truth": "4"}\n')
GOOD_ROWS = b'{"data_source": "openai/gsm8k", "response": "#### 4", "ground_truth": "4"}\n'


def run(*args: str, prefix: list[str] | None = None, env: dict | None = None, timeout: float = 300):
    return subprocess.run([*(prefix or []), *rlkit_cmd(*args)], capture_output=True, text=True, timeout=timeout,
                          env={**cli_env(), **(env or {})})


def one_error(proc: subprocess.CompletedProcess) -> str:
    """The single `error:` line of a failed command, checked to come without a traceback."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "During handling" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def in_private_tmpfs(options: str, mountpoint: Path) -> list[str]:
    """A command prefix running its command with a tmpfs (`options`) over `mountpoint`, seen only by it."""
    shell = 'mount -t tmpfs -o "$1" none "$2" && shift 2 && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", shell, "sh", options, str(mountpoint)]


def test_read_only_file_system_is_one_error_and_the_cleanup_raises_no_second(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    msg = one_error(run("data", "toy", "--out", str(out), prefix=in_private_tmpfs("ro", out)))
    assert f"{out}/train.parquet: cannot write" in msg and "Read-only file system" in msg


def test_full_disk_names_the_file_and_the_fix(tmp_path):
    out = tmp_path / "small"
    out.mkdir()
    msg = one_error(run("data", "gsm8k", "--out", str(out), prefix=in_private_tmpfs("size=64k", out)))
    assert f"{out}/train.parquet: cannot write" in msg and "No space left on device" in msg
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(GOOD_ROWS)
    msg = one_error(run("reward", "score", str(rows), "--out", "/dev/full"))
    assert msg == "error: /dev/full: no space left on device; free some space or choose a path on another disk"


def test_permission_denied_names_the_file(tmp_path, model_and_data):
    model, data = model_and_data
    locked = tmp_path / "model"
    shutil.copytree(model, locked)
    config = locked / "config.json"
    if os.geteuid() == 0:  # root reads everything: drop the capabilities that let it
        os.chown(config, 65534, 65534)
        config.chmod(0o600)
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    else:
        config.chmod(0)
        prefix = []
    msg = one_error(run("eval", str(locked), "--data", str(data), "--backend", "hf", "--out",
                        str(tmp_path / "e.jsonl"), prefix=prefix))
    assert msg == f"error: {config}: permission denied; check its permissions, or choose a path you can write to"


def test_undecodable_text_names_file_line_and_column(tmp_path):
    rows = tmp_path / "latin1.jsonl"
    rows.write_bytes(LATIN1_ROWS)
    msg = one_error(run("reward", "score", str(rows)))
    assert msg.startswith(f"error: {rows} line 2 column 49: not valid utf-8 text (byte 0xe9")
    assert "save it as UTF-8" in msg
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(b"trainer:\n  project_name: caf\xe9\n")
    msg = one_error(run("train", "grpo", "--config", str(cfg), "--dry-run"))
    assert msg.startswith(f"error: {cfg} line 2 column 20: not valid utf-8 text")


@pytest.mark.parametrize("how", [["--traceback"], "RLKIT_DEBUG"])
def test_traceback_on_request(tmp_path, how):
    rows = tmp_path / "latin1.jsonl"
    rows.write_bytes(LATIN1_ROWS)
    flags, env = (how, {}) if isinstance(how, list) else ([], {how: "1"})
    proc = run(*flags, "reward", "score", str(rows), env=env)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "UnicodeDecodeError" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith(f"error: {rows} line 2")


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory) -> tuple[Path, Path]:
    from rlkit.testing import save_tiny_model

    root = tmp_path_factory.mktemp("cli_errors")
    model = save_tiny_model(root / "model", tie_embeddings=True)
    proc = run("data", "toy", "--out", str(root / "toy"), "--length", "1", "--test-size", "4")
    assert proc.returncode == 0, proc.stderr
    return model, root / "toy" / "test.parquet"


@pytest.mark.parametrize("name", ["tokenizer_config.json", "tokenizer.json", "config.json"])
def test_broken_json_in_a_model_folder_names_the_file(tmp_path, model_and_data, name):
    model, data = model_and_data
    broken = tmp_path / "model"
    shutil.copytree(model, broken)
    (broken / name).write_text('{"vocab_size": 64,\n  "oops"\n')
    msg = one_error(run("eval", str(broken), "--data", str(data), "--backend", "hf", "--max-prompt-length", "32",
                        "--max-response-length", "4", "--out", str(tmp_path / "e.jsonl")))
    assert f"{broken / name} line 3 column 1: not valid JSON" in msg


def test_damaged_weights_file_names_it(tmp_path, model_and_data):
    model, data = model_and_data
    broken = tmp_path / "model"
    shutil.copytree(model, broken)
    weights = broken / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(1000)  # an interrupted copy
    msg = one_error(run("eval", str(broken), "--data", str(data), "--backend", "hf", "--max-prompt-length", "32",
                        "--max-response-length", "4", "--out", str(tmp_path / "e.jsonl")))
    assert f"{weights}: cannot load it (SafetensorError" in msg and "damaged or incomplete" in msg


def test_a_bug_keeps_its_traceback():
    """Only user errors are shortened: an unexpected exception still shows where it happened."""
    code = ("import typer\nfrom typer.testing import CliRunner\nfrom rlkit_cli.errors import friendly_errors\n"
            "app = typer.Typer()\n@app.command()\n@friendly_errors\ndef boom():\n    return {}['missing']\n"
            "res = CliRunner().invoke(app, [])\nprint(type(res.exception).__name__, res.exit_code)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.stdout.split() == ["KeyError", "1"], proc.stdout + proc.stderr
