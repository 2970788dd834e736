"""verl's SFT entry points run as `rlkit train sft` with the same overrides (issue 43 item 6): verl-style scripts of
both layouts (tests/trainer/verl_scripts/sft/: `torchrun ... -m verl.trainer.fsdp_sft_trainer` with single-turn dict
columns, LoRA and sequence parallelism; `-m verl.trainer.sft_trainer` with the engine/optim groups and multi-turn
conversations) are expanded by bash itself (torchrun replaced by a recorder of its arguments), and what follows the
module passes `rlkit train sft --dry-run` unchanged."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlkit_cli.main import app

SCRIPTS = Path(__file__).resolve().parent / "verl_scripts" / "sft"
MODULES = ("verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer")


def launcher_args(script: Path, env: dict[str, str], tmp_path: Path) -> tuple[str, list[str]]:
    """(the module, its arguments) as bash passes them to `torchrun ... -m MODULE`."""
    bin_dir, record = tmp_path / "bin", tmp_path / "args.txt"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    (bin_dir / "torchrun").chmod(0o755)
    run_env = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGS_OUT": str(record)}
    res = subprocess.run(["bash", str(script), "1", str(tmp_path / "ckpt")], env=run_env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    words = record.read_text().splitlines()
    at = words.index("-m")
    return words[at + 1], words[at + 2:]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    """GSM8K in verl's layout (single-turn: extra_info {question, answer}) and rlkit's (messages)."""
    out = tmp_path_factory.mktemp("sft")
    res = CliRunner().invoke(app, ["data", "gsm8k", "--format", "sft", "--no-hub", "--limit", "16", "--out",
                                   str(out / "chats")])
    assert res.exit_code == 0, res.output
    (out / "single").mkdir()
    for split in ("train", "test"):
        table = pq.read_table(out / "chats" / f"{split}.parquet")
        pq.write_table(table.drop_columns(["messages"]), out / "single" / f"{split}.parquet")
    return out


@pytest.mark.parametrize("script, data", [("fsdp_sft_single_turn.sh", "single"), ("sft_trainer_engine.sh", "chats")])
def test_verl_sft_script_passes_dry_run(script, data, sft_data, tiny_model, tmp_path):
    env = {"DATA_DIR": str(sft_data / data), "MODEL_PATH": str(tiny_model), "CKPT_HOME": str(tmp_path / "ck")}
    module, args = launcher_args(SCRIPTS / script, env, tmp_path)
    assert module in MODULES
    res = CliRunner().invoke(app, ["train", "sft", *args, "--dry-run"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "pre-flight ok: " in out and "16 training conversations" in out
    assert "ulysses_sequence_parallel_size=2 -> rlkit's SFT trainer has no sequence parallelism" in out
