"""The DPO role on a 1-rank gloo group in this process, as a worker runs it: the reference's log-probs of a pair batch
equal a plain transformers forward of the same sequences, with a frozen reference model and with LoRA (the policy
with its adapter off); the precomputed reference's sums are those of the same forward, and releasing the reference
frees its weights (nothing with LoRA). That DPO learns: tests/trainer/test_dpo.py."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlkit.config.dpo_schema import DPOSection
from rlkit.config.fsdp import FSDPConfig
from rlkit.config.sft_schema import SFTModelConfig, SFTOptimConfig
from rlkit.data.preference import PreferenceDataset, as_sequences, split_sides
from rlkit.testing import build_tiny_tokenizer, save_tiny_model
from rlkit.workers.dpo_worker import DPOWorker
from rlkit.workers.micro_batch import MicroBatching

PAIRS = [
    {"prompt": "copy the digits : 1 2 3", "chosen": "1 2 3", "rejected": "3 2"},
    {"prompt": "what is 2 + 3 ?", "chosen": "the answer is 5 .", "rejected": "6"},
    {"prompt": "reverse 4 5", "chosen": "5 4", "rejected": "4 5 think"},
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, process_group):
    root = tmp_path_factory.mktemp("dpo")
    model = save_tiny_model(root / "tiny", heads=2, tie_embeddings=True)
    pq.write_table(pa.Table.from_pylist(PAIRS), root / "pairs.parquet")
    return model, PreferenceDataset(root / "pairs.parquet", build_tiny_tokenizer())


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_reference_log_probs_equal_a_plain_forward(setup, lora_rank):
    from transformers import AutoModelForCausalLM

    model_path, data = setup
    worker = DPOWorker(SFTModelConfig(path=str(model_path), enable_gradient_checkpointing=False, lora_rank=lora_rank),
                       FSDPConfig(), SFTOptimConfig(lr=1e-2), DPOSection(), ref_path=str(model_path), total_steps=1,
                       seed=0, micro=MicroBatching(2), packed=True)
    worker.init_model()
    assert (worker.ref is None) == (lora_rank > 0)
    if lora_rank:  # a trained adapter: the policy differs from the base, the reference must not
        for name, p in worker.model.module.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p.data if not hasattr(p, "to_local") else p.to_local(), std=0.5)
    batch = data.get_batch(range(len(data)))
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    rows = as_sequences(batch)
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = plain(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                       position_ids=rows["position_ids"]).logits
    width = rows["responses"].shape[1]
    logp = torch.log_softmax(logits[:, -width - 1:-1].float(), -1).gather(-1, rows["responses"].unsqueeze(-1))[..., 0]
    mask = rows["response_mask"].bool()
    got = torch.cat(split_sides(ref), dim=0)
    assert torch.allclose(got[mask], logp[mask], atol=1e-5), (got[mask] - logp[mask]).abs().max()
    policy = torch.cat(split_sides(worker.compute_log_prob(batch)["log_probs"]), dim=0)
    assert torch.allclose(policy[mask], logp[mask], atol=1e-5) == (lora_rank == 0)
    # dpo.ref.precompute: the reduced reference (sums; IPO's means) of the same forward, then the reference dropped
    from rlkit.algo.preference_loss import reference_logps

    stored = worker.compute_ref_logps(batch)["ref_logps"]
    sides = [reference_logps(t, m, "sigmoid") for t, m in zip(split_sides(ref), split_sides(batch["response_mask"]),
                                                                strict=True)]
    assert torch.equal(stored, torch.stack(sides, dim=1))
    held = worker.memory_report()["ref_mb"]
    assert (held > 0) == (lora_rank == 0)
    assert worker.release_reference()["ref_freed_mb"] == held and worker.memory_report()["ref_mb"] == 0
    if lora_rank:  # nothing was freed: the reference is the policy's base weights, still there
        assert torch.equal(worker.compute_ref_logps(batch)["ref_logps"], stored)
    else:
        with pytest.raises(RuntimeError, match="reference was released"):
            worker.compute_ref_logps(batch)
