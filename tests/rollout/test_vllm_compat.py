"""Tripwires for rlkit's vLLM patches (rlkit/rollout/vllm_compat.py): each test fails when the installed vLLM
no longer has a private name a patch uses (the patch would break) or no longer has the behaviour the patch works
around (the patch should go). They read vLLM's code; no engine is started (tests/rollout/test_vllm_rollout.py and
tests/hybrid/ run the patched engine for real)."""

from __future__ import annotations

import inspect
import types

import pytest

pytest.importorskip("vllm")  # installed by `make setup`; a skip fails the run (tests/skip_guard.py)

from rlkit.rollout import vllm_compat  # noqa: E402


def test_the_installed_vllm_is_one_the_patches_were_written_for():
    assert vllm_compat.check_version().startswith(vllm_compat.TESTED_VLLM)


def test_cpu_shm_names_are_still_per_launch_not_per_job_and_the_patch_applies(monkeypatch):
    from vllm.distributed.device_communicators import cpu_communicator

    shm = cpu_communicator._CPUSHMDistributed
    assert callable(shm._init_cpu_shm)
    source = inspect.getsource(shm.make_group_name)
    assert "MASTER_PORT" not in source and "getpid" not in source  # still collides across jobs: needed
    monkeypatch.setenv("VLLM_DIST_IDENT", "env://")
    monkeypatch.setenv("MASTER_PORT", "29577")
    vllm_compat.unique_cpu_shm_names()
    name = shm.make_group_name(types.SimpleNamespace(unique_name="tp:0", ranks=[0, 1]))
    assert name.startswith("rlkit29577") and "/" not in name


def test_the_inproc_engine_still_shuts_down_the_world_group():
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.core_client import InprocClient

    assert "weakref.finalize(self, self.engine_core.shutdown)" in inspect.getsource(InprocClient.__init__)
    assert "cleanup_dist_env_and_memory" in inspect.getsource(EngineCore.shutdown)  # the reason for the swap


def test_the_cpu_worker_still_ignores_sleep_and_keeps_its_kv_caches_list():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert "not supported" in inspect.getsource(CPUWorker.sleep)  # else vLLM frees the cache itself
    assert "self.kv_caches" in inspect.getsource(GPUModelRunner.__init__)  # what release_kv_cache resizes


def test_the_cpu_moe_experts_still_have_the_prepack_the_repack_calls():
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    assert callable(CPUUnquantizedExperts.process_weights_after_loading)
    assert callable(CPUUnquantizedExperts._padded_intermediate_size)
