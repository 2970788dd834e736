from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from rlkit.errors import UserError
from rlkit.rollout import (
    ROLLOUT_BACKENDS,
    HFRollout,
    RolloutConfig,
    VLLMRollout,
    default_backend_name,
    prepare_vllm_env,
)


def test_defaults_are_cpu_friendly():
    cfg = RolloutConfig()
    assert cfg.dtype == "auto" and cfg.enforce_eager and cfg.tensor_model_parallel_size == 1
    assert cfg.kv_cache_memory_mb is None and cfg.gpu_memory_utilization == 0.5
    assert cfg.top_k == -1 and cfg.free_cache_engine and cfg.sleep_level is None
    assert cfg.model_len == cfg.prompt_length + cfg.response_length
    assert cfg.val_kwargs.temperature == 0 and not cfg.val_kwargs.do_sample and cfg.val_kwargs.n == 1


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"dtype": "fp8"}, "dtype"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"temperature": -1.0}, "temperature"),
        ({"n": 0}, "n="),
        ({"sleep_level": 3}, "sleep_level"),
        ({"max_model_len": 8}, "max_model_len"),
        ({"val_kwargs": {"top_p": 2.0}}, "val_kwargs.top_p"),
        ({"engine_kwargs": {"sglang": {"mem_fraction_static": 0.5}}}, r"engine_kwargs.sglang=.*engine_kwargs.vllm"),
        ({"engine_kwargs": {"tgi": {}}}, "engine_kwargs.tgi: not an engine"),
        ({"engine_kwargs": {"vllm": {"enforce_eager": False}}}, r"engine_kwargs.vllm.enforce_eager: set .*"),
        ({"engine_kwargs": {"vllm": {"logprobs_mode": "raw_logprobs"}}}, "engine_kwargs.vllm.logprobs_mode: rlkit"),
        ({"ignore_eos": True, "multi_turn": {"enable": True}}, "ignore_eos=true: a multi-turn rollout's turns end"),
    ],
)
def test_bad_values_name_the_key(kwargs, key):
    with pytest.raises(UserError, match=f"actor_rollout_ref.rollout.{key}"):
        RolloutConfig(**kwargs)


def test_verl_engine_keys_and_defaults():
    cfg = RolloutConfig(engine_kwargs={"vllm": {"max_logprobs": 5}, "sglang": {}, "trtllm": None})
    assert cfg.vllm_kwargs == {"max_logprobs": 5}  # empty sglang/trtllm sections are fine
    d = RolloutConfig()
    assert (d.enable_chunked_prefill, d.enable_prefix_caching, d.disable_log_stats, d.load_format) == (
        True, True, True, "dummy")
    assert d.engine_kwargs == {"vllm": {}, "sglang": {}, "trtllm": {}}


def test_vllm_kwargs_vllm_does_not_take_are_named():
    pytest.importorskip("vllm")
    from rlkit.rollout.vllm_rollout import check_vllm_kwargs, vllm_load_format

    check_vllm_kwargs({"max_logprobs": 5, "compilation_config": {"cudagraph_mode": "FULL"}})
    with pytest.raises(UserError, match=r"engine_kwargs.vllm.tool_call_parser: not an argument of vLLM .*'s engine"):
        check_vllm_kwargs({"max_logprobs": 5, "tool_call_parser": "hermes"})
    assert [vllm_load_format(f) for f in ("dummy", "dummy_dtensor", "safetensors", "auto")] == [
        "auto", "auto", "safetensors", "auto"]


def test_to_sampling():
    cfg = RolloutConfig(response_length=7, temperature=0.7, top_p=0.9, top_k=5, calculate_log_probs=True)
    s = cfg.to_sampling()
    assert (s.response_length, s.temperature, s.top_p, s.top_k, s.greedy) == (7, 0.7, 0.9, 5, False)
    assert s.calculate_log_probs and s.seed is None
    assert cfg.to_sampling(greedy=True).greedy
    assert RolloutConfig(do_sample=False).to_sampling().greedy
    val = cfg.to_val_sampling()
    assert val.greedy and not val.calculate_log_probs and val.response_length == 7
    sampled_val = RolloutConfig(val_kwargs={"do_sample": True, "temperature": 0.6, "n": 4}).to_val_sampling()
    assert not sampled_val.greedy and sampled_val.temperature == 0.6


def test_ignore_eos_drops_the_models_stops_and_keeps_the_callers():
    cfg = RolloutConfig(ignore_eos=True)
    train, val = cfg.to_sampling(), cfg.to_val_sampling()
    assert train.ignore_eos and val.ignore_eos
    assert dataclasses.replace(train, stop_token_ids=[9]).stops([2, 9, 3]) == [9]
    plain = RolloutConfig().to_sampling()
    assert dataclasses.replace(plain, stop_token_ids=[9]).stops([2, 9, 3]) == [9, 2, 3]


def test_registry_and_default_backend(monkeypatch):
    assert ROLLOUT_BACKENDS.get("hf") is HFRollout
    assert ROLLOUT_BACKENDS.get("vllm") is VLLMRollout
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert default_backend_name() == "hf"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert default_backend_name() == "vllm"


def test_prepare_vllm_env_keeps_user_values(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "mine"))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    prepare_vllm_env()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "mine")
    assert "rlkit-vllm-" in os.environ["VLLM_RPC_BASE_PATH"]


def test_engine_dtype_auto_follows_the_actor(monkeypatch):
    """`rollout.dtype: auto`: bf16 on GPU; on CPU whatever `param_dtype: auto` chose for the actor."""
    from rlkit.rollout.base import engine_dtype
    from rlkit.utils import cpu_precision

    assert engine_dtype("auto", on_gpu=True) == "bfloat16" and engine_dtype("float16", on_gpu=False) == "float16"
    try:
        for forced in ("bfloat16", "float32"):
            monkeypatch.setenv(cpu_precision.OVERRIDE_ENV, forced)
            cpu_precision.auto_cpu_dtype.cache_clear()
            assert engine_dtype("auto", on_gpu=False) == forced
    finally:
        cpu_precision.auto_cpu_dtype.cache_clear()
