"""verl-style run scripts (tests/trainer/verl_scripts/: GRPO, PPO with a critic, LoRA, Megatron, DAPO's reward manager,
multi-turn with a tool config), unchanged but for paths and CPU sizes, run as `rlkit train` in place of
`python3 -m verl.trainer.main_ppo`: every one passes `--dry-run`, and two train 2 real steps on a tiny model."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlkit_cli.main import app
from tests.trainer.conftest import fit, read_metrics, train_rows

SCRIPTS = Path(__file__).resolve().parent / "verl_scripts"
LAUNCHER = "verl.trainer.main_ppo"


def script_args(script: Path, env: dict[str, str]) -> list[str]:
    """The launcher's arguments, as bash would pass them: the script's variables and `env` expanded, `$@` empty."""
    text = script.read_text().replace("\\\n", " ")
    variables = dict(env)
    expand = re.compile(r"\$\{?(\w+|@)\}?")

    def sub(word: str) -> str:
        return expand.sub(lambda m: variables.get(m.group(1), ""), word)

    for name, value in re.findall(r"^(\w+)=(\S+)\s*$", text, flags=re.M):
        variables[name] = sub(value.strip("'\""))
    line = next(ln for ln in text.splitlines() if LAUNCHER in ln)
    return [w for w in map(sub, shlex.split(line.split(LAUNCHER, 1)[1])) if w]


@pytest.fixture(scope="module")
def script_env(toy_data, tmp_path_factory) -> dict[str, str]:
    from rlkit.testing import save_tiny_model

    # heads=2: head_dim 32, a size vLLM's CPU attention runs (the scripts name rollout.name=vllm)
    model = save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2, tie_embeddings=True)
    return {"DATA_DIR": str(toy_data), "MODEL_PATH": str(model), "SCRIPT_DIR": str(SCRIPTS),
            "CKPTS_DIR": str(tmp_path_factory.mktemp("verl_ckpt"))}


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_verl_script_passes_dry_run(script, script_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # checkpoints/... of a script without default_local_dir land here
    args = script_args(SCRIPTS / script, script_env)
    result = CliRunner().invoke(app, ["train", *args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "pre-flight ok" in result.output


def test_two_verl_scripts_train_two_steps(script_env, tmp_path):
    """The GRPO and the PPO-with-critic scripts run 2 real steps (PPO's critic_warmup=1: the actor waits a step)."""
    for script in ("grpo_gsm8k.sh", "ppo_critic.sh"):
        args = script_args(SCRIPTS / script, script_env)
        log_dir = tmp_path / script
        args += [f"trainer.default_local_dir={log_dir / 'ckpt'}", f"trainer.log_dir={log_dir}", "trainer.logger=[file]"]
        summary, rows, _ = fit(None, [a for a in args if not a.startswith("--")], log_dir)
        rows = train_rows(read_metrics(log_dir))
        assert summary.steps == 2 and len(rows) == 2, script


def test_megatron_script_plans_a_tp2_mesh(script_env, tmp_path, monkeypatch):
    """verl's Megatron GRPO example (megatron_grpo.sh): tensor_model_parallel_size=2 over the 2 workers is one TP
    group for the actor and the reference, as the dry run's plan shows; the pipeline size the example ships (2) is
    refused with the reason."""
    monkeypatch.chdir(tmp_path)
    args = script_args(SCRIPTS / "megatron_grpo.sh", script_env)
    result = CliRunner().invoke(app, ["train", *args, "--dry-run"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = dict(re.findall(r"│ (\w+) mesh\s+│ (.+?)\s+│", result.output))
    assert rows.keys() == {"actor", "ref"}, result.output
    for role, line in rows.items():
        assert line.startswith("replicate 1 x shard 1 x tp 2 (2 workers)"), (role, line)
    shipped = [*args, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"]
    result = CliRunner().invoke(app, ["train", *shipped, "--dry-run"])
    assert result.exit_code == 1
    assert "pipeline_model_parallel_size=2" in result.output and "pipeline parallel is not in rlkit" in result.output
