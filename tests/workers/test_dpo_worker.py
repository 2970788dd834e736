"""The DPO role on a 1-rank gloo group in this process, as a worker runs it.

- the reference's log-probs of a pair batch equal a plain transformers forward of the same sequences;
- DPO learns (one shared run): on pairs whose chosen reply ends in a marker token ("think") and whose rejected reply
  does not, the held-out preference accuracy rises from ~50% to > 90%, and the policy's own samples contain the
  marker more often than the start model's.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlkit.algo.preference_loss import preference_loss
from rlkit.config.dpo_schema import DPOSection
from rlkit.config.fsdp import FSDPConfig
from rlkit.config.sft_schema import SFTModelConfig, SFTOptimConfig
from rlkit.data.preference import PreferenceDataset, as_sequences, split_sides
from rlkit.testing import build_tiny_tokenizer, save_tiny_model
from rlkit.workers.dpo_worker import DPOWorker
from rlkit.workers.micro_batch import MicroBatching

MARKER = "think"
STEPS, BATCH = 15, 8


def marker_pairs(n: int, seed: int) -> list[dict]:
    """copy-the-digits prompts; chosen = the digits + the marker, rejected = the digits + one more digit."""
    rng = np.random.default_rng(seed)
    rows = []
    for digits in rng.integers(0, 10, size=(n, 3)):
        text = " ".join(map(str, digits))
        rows.append({"prompt": f"copy the digits : {text}", "chosen": f"{text} {MARKER}",
                     "rejected": f"{text} {rng.integers(0, 10)}"})
    return rows


@pytest.fixture(scope="module")
def setup(tmp_path_factory, process_group):
    root = tmp_path_factory.mktemp("dpo")
    model = save_tiny_model(root / "tiny", heads=2, tie_embeddings=True)
    for name, n, seed in (("train", STEPS * BATCH, 0), ("val", 64, 1)):
        pq.write_table(pa.Table.from_pylist(marker_pairs(n, seed)), root / f"{name}.parquet")
    tok = build_tiny_tokenizer()
    train = PreferenceDataset(root / "train.parquet", tok, max_prompt_length=32, max_length=48)
    val = PreferenceDataset(root / "val.parquet", tok, max_prompt_length=32, max_length=48)
    return model, train, val, tok


def make_worker(model_path, lora_rank: int = 0, lr: float = 1e-2) -> DPOWorker:
    worker = DPOWorker(SFTModelConfig(path=str(model_path), enable_gradient_checkpointing=False, lora_rank=lora_rank),
                       FSDPConfig(), SFTOptimConfig(lr=lr, weight_decay=0.0, clip_grad=1.0), DPOSection(beta=0.1),
                       ref_path=str(model_path), total_steps=STEPS, seed=0, micro=MicroBatching(8), packed=True)
    worker.init_model()
    return worker


def test_reference_log_probs_equal_a_plain_forward(setup):
    from transformers import AutoModelForCausalLM

    model_path, train, _, _ = setup
    worker = make_worker(model_path)
    batch = train.get_batch(range(5))
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    rows = as_sequences(batch)
    plain = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = plain(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                       position_ids=rows["position_ids"]).logits
    R = rows["responses"].shape[1]
    logp = torch.log_softmax(logits[:, -R - 1:-1].float(), -1).gather(-1, rows["responses"].unsqueeze(-1))[..., 0]
    mask = rows["response_mask"].bool()
    got = torch.cat(split_sides(ref), dim=0)
    assert torch.allclose(got[mask], logp[mask], atol=1e-5), (got[mask] - logp[mask]).abs().max()


def accuracies(worker: DPOWorker, data: PreferenceDataset) -> tuple[float, float]:
    """(the policy's own preference: log p(chosen) > log p(rejected), DPO's rewards/accuracies) on `data`."""
    batch = data.get_batch(range(len(data)))
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    pol = worker.compute_log_prob(batch)["log_probs"]
    masks = split_sides(batch["response_mask"])
    (chosen, rejected), (c_mask, r_mask) = split_sides(pol), masks
    own = float(((chosen * c_mask).sum(-1) > (rejected * r_mask).sum(-1)).float().mean())
    return own, float(preference_loss(chosen, rejected, *split_sides(ref), *masks)["rewards/accuracies"])


def marker_rate(worker: DPOWorker, model_path, tok, data: PreferenceDataset, samples: int = 4) -> float:
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).eval()
    plain.load_state_dict(worker.full_state_dict())
    marker = tok.convert_tokens_to_ids(MARKER)
    prompts = torch.tensor(np.stack([p.prompt for p in data.pairs]))  # equal lengths: no padding
    torch.manual_seed(0)
    with torch.no_grad():
        out = plain.generate(prompts, do_sample=True, max_new_tokens=6, num_return_sequences=samples,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return float((out[:, prompts.shape[1]:] == marker).any(-1).float().mean())


def test_dpo_learns_the_marker(setup):
    model_path, train, val, tok = setup
    worker = make_worker(model_path)
    before = accuracies(worker, val), marker_rate(worker, model_path, tok, val)
    start, losses = time.perf_counter(), []
    for step in range(STEPS):
        batch = train.get_batch(range(step * BATCH, (step + 1) * BATCH))
        metrics = worker.train_batch(batch.union(worker.compute_ref_log_prob(batch))).meta["metrics"]
        losses.append(metrics["train/loss"][0])
    per_step = (time.perf_counter() - start) / STEPS
    after = accuracies(worker, val), marker_rate(worker, model_path, tok, val)
    print(f"preference accuracy {before[0][0]:.2f} -> {after[0][0]:.2f} (rewards/accuracies {after[0][1]:.2f}), "
          f"marker in samples {before[1]:.2f} -> {after[1]:.2f}, {per_step:.3f} s/step")
    assert before[0][0] < 0.6 and before[0][1] == 0.0  # policy = reference: every implicit reward is 0
    assert after[0][0] > 0.9 and after[0][1] > 0.9
    assert after[1] > before[1] + 0.3
    assert set(metrics) >= {"train/loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                            "rewards/margins", "logps/chosen", "logps/rejected", "train/grad_norm", "train/lr"}
    assert losses[0] == pytest.approx(np.log(2), abs=1e-5) and losses[-1] < 0.3  # the first step is at the reference
