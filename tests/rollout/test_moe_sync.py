"""A mixture-of-experts weight sync into vLLM: the trainer streams fused in-memory experts, the engine ends up
with exactly the new model (its log-probs equal a transformers forward of the new weights)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("vllm")

from rlkit.rollout import VLLMRollout  # noqa: E402
from rlkit.testing import MOE_FAMILIES, build_tiny_moe, save_tiny_moe  # noqa: E402
from tests.rollout.helpers import perturbed_state, reference_log_probs  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]
LOGPROB_TOL = 1e-4  # vLLM's CPU kernels vs one transformers forward, float32 (dense: ~1e-6)


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_synced_engine_equals_the_new_weights(family, tmp_path, vllm_config, prompts):
    folder = save_tiny_moe(tmp_path / family, family)
    new_model, _ = build_tiny_moe(family)
    new_model.load_state_dict(perturbed_state(new_model, seed=5, scale=0.5))
    engine = VLLMRollout(folder, vllm_config)
    try:
        sampling = dataclasses.replace(vllm_config.to_sampling(), temperature=1.0)
        before = engine.generate(prompts.repeat(2), sampling)
        stale = (before["rollout_log_probs"] - reference_log_probs(new_model, before)).abs().max()
        assert stale > 1e-2, "the perturbation should change the model's log-probs"
        engine.update_weights(new_model.state_dict().items())  # in-memory names: fused experts
        assert engine.last_update["tensors"] == len(engine.weight_names.shapes)
        after = engine.generate(prompts.repeat(2), sampling)
        torch.testing.assert_close(after["rollout_log_probs"], reference_log_probs(new_model, after),
                                   atol=LOGPROB_TOL, rtol=0)
        greedy = engine.generate(prompts, vllm_config.to_sampling(greedy=True))
        hf_greedy = new_model.generate(
            prompts["input_ids"], attention_mask=prompts["attention_mask"], do_sample=False,
            max_new_tokens=greedy["responses"].shape[1], pad_token_id=engine.pad_id, eos_token_id=engine.stop_ids,
        )[:, prompts["input_ids"].shape[1]:]
        n = hf_greedy.shape[1]
        assert torch.equal(greedy["responses"][:, :n] * greedy["response_mask"][:, :n],
                           hf_greedy * greedy["response_mask"][:, :n])
    finally:
        engine.close()


def test_an_moe_engine_after_a_dense_one_in_the_same_process(vllm_engine, tmp_path, vllm_config, prompts):
    """vLLM makes its expert-parallel group only for a process's first engine when that one is an MoE: an MoE
    engine after the session's dense one failed ("EP group is not initialized") until rlkit reset the groups
    (vllm_compat.ready_parallel_groups). Both engines generate afterwards."""
    assert vllm_engine.generate(prompts, vllm_config.to_sampling(greedy=True))["responses"].numel() > 0
    engine = VLLMRollout(save_tiny_moe(tmp_path / "moe", "qwen3_moe"), vllm_config)
    try:
        out = engine.generate(prompts, vllm_config.to_sampling(greedy=True))
        assert out["responses"].shape[0] == len(prompts["input_ids"])
    finally:
        engine.close()
    assert vllm_engine.generate(prompts, vllm_config.to_sampling(greedy=True))["responses"].numel() > 0
