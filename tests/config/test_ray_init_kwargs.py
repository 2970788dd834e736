"""verl's `ray_kwargs.*`: read from a run script as verl writes them, merged into rlkit's ray.init arguments, and
passed to a real Ray (env_vars and py_executable reach the workers; the timeline file is written)."""

from __future__ import annotations

import json
import sys

import pytest
from rich.console import Console

from rlkit.trainer.run.ray_init_kwargs import merge_ray_init
from rlkit.trainer.run.run_config import load_config

BASE = ["data.train_files=/tmp/x.parquet", "actor_rollout_ref.model.path=/tmp/model", "trainer.device=cpu"]
OURS = {"runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "RLKIT_DIST_TIMEOUT_S": "1800"},
                        "worker_process_setup_hook": "hook"}, "address": "local", "num_cpus": 2}


def test_verl_script_keys_reach_the_config():
    cfg = load_config(None, [*BASE, "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=WARN",
                             f"+ray_kwargs.ray_init.runtime_env.py_executable={sys.executable}",
                             "ray_kwargs.ray_init.num_cpus=null", "ray_kwargs.timeline_json_file=/tmp/t.json"])
    assert cfg.ray_kwargs.ray_init == {"runtime_env": {"env_vars": {"NCCL_DEBUG": "WARN"},
                                                       "py_executable": sys.executable}, "num_cpus": None}
    assert cfg.ray_kwargs.timeline_json_file == "/tmp/t.json"


def test_user_runtime_env_merges_with_rlkits_own():
    user = {"runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": "true", "RLKIT_DIST_TIMEOUT_S": "5", "N": 1},
                            "working_dir": "/w", "worker_process_setup_hook": "theirs"}, "num_cpus": 64,
            "object_store_memory": 10**9, "num_gpus": None}
    out, line = merge_ray_init(OURS, user, joining=False)
    env = out["runtime_env"]
    assert env["env_vars"] == {"TOKENIZERS_PARALLELISM": "true", "RLKIT_DIST_TIMEOUT_S": "1800", "N": "1"}
    assert env["working_dir"] == "/w" and env["worker_process_setup_hook"] == "hook"  # rlkit's hook kept
    assert out["num_cpus"] == 64 and out["object_store_memory"] == 10**9 and "num_gpus" not in out and line is None
    assert merge_ray_init(OURS, user, joining=False, cli_num_cpus=3)[0]["num_cpus"] == 2  # --num-cpus already set
    assert merge_ray_init(OURS, {}, joining=False) == (OURS, None)


def test_joining_a_cluster_drops_what_ray_refuses_there_in_one_line():
    out, line = merge_ray_init({"address": "10.0.0.1:6379"}, {"num_cpus": 8, "include_dashboard": True,
                                                                "runtime_env": {"env_vars": {"A": "b"}},
                                                                "log_to_driver": False}, joining=True)
    assert out == {"address": "10.0.0.1:6379", "runtime_env": {"env_vars": {"A": "b"}}, "log_to_driver": False}
    assert line.startswith("joining a running Ray cluster: ray_kwargs.ray_init num_cpus=8, include_dashboard=True "
                           "ignored") and "\n" not in line


@pytest.mark.slow
@pytest.mark.serial
def test_a_real_ray_gets_the_env_vars_and_the_timeline(tmp_path, monkeypatch):
    import ray

    from rlkit.trainer.run.launch import LaunchOptions, init_ray
    from rlkit.trainer.run.ray_init_kwargs import write_timeline

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    timeline = tmp_path / "trace" / "timeline.json"
    cfg = load_config(None, [*BASE, "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_STYLE_VAR=from_script",
                             f"+ray_kwargs.ray_init.runtime_env.py_executable={sys.executable}",
                             f"ray_kwargs.timeline_json_file={timeline}"])
    try:
        init_ray(cfg, LaunchOptions(num_cpus=1), Console(file=sys.stderr))

        @ray.remote(num_cpus=0)
        def probe():
            import os

            return os.environ.get("VERL_STYLE_VAR"), os.environ.get("RLKIT_DIST_TIMEOUT_S")

        assert ray.get(probe.remote()) == ("from_script", "1800")
        assert write_timeline(cfg.ray_kwargs.timeline_json_file) == str(timeline)
        assert isinstance(json.loads(timeline.read_text()), list)
    finally:
        ray.shutdown()
