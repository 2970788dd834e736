"""GRPO raises a classifier RM's reward: the RM worker is wired into the loop, not just loaded.

The RM is built here with a known preference: a 1-layer LlamaForSequenceClassification whose attention
averages the token embeddings (q = k = 0: uniform attention; v = o = identity; no MLP) and whose score
head points along the embedding of the word "think". A response scores higher the more "think" tokens it
holds (the prompt's own tokens only shift all of a prompt's samples alike). The toy prompts ("copy the
digits : 7") never ask for "think", so a random policy says it rarely: ~0.3 at the start; with
`reward_model.mix: {rule: 0, rm: 1}` (pure RM) GRPO learns to say it.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from rlkit.testing import build_tiny_reward_model, build_tiny_tokenizer
from tests.trainer.conftest import fit, toy_overrides, train_rows

TARGET = "think"
STEPS = 40


def save_target_rm(path: Path, target: str = TARGET, seed: int = 0) -> Path:
    """The RM described in the module docstring, saved as an HF folder with the tiny tokenizer."""
    tok = build_tiny_tokenizer()
    model = build_tiny_reward_model(tok, hidden_size=64, layers=1, heads=4, seed=seed)
    with torch.no_grad():
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        attn.q_proj.weight.zero_()
        attn.k_proj.weight.zero_()
        attn.v_proj.weight.copy_(torch.eye(64))
        attn.o_proj.weight.copy_(torch.eye(64))
        mlp.down_proj.weight.zero_()
        e = model.model.embed_tokens.weight[tok.convert_tokens_to_ids(target)]
        model.score.weight.copy_(e / e.norm())
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def rm_score(rm_path: Path, response: str) -> float:
    from transformers import AutoModelForSequenceClassification

    tok = build_tiny_tokenizer()
    model = AutoModelForSequenceClassification.from_pretrained(rm_path).eval()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "copy the digits : 7"}], tokenize=False, add_generation_prompt=True
    )
    with torch.no_grad():
        return float(
            model(input_ids=torch.tensor([tok(prompt + response, add_special_tokens=False)["input_ids"]])).logits[0, 0]
        )


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~1 min on idle cores
def test_grpo_raises_the_reward_model_score(toy_data, tiny_model, tmp_path):
    rm = save_target_rm(tmp_path / "rm")
    best, plain = rm_score(rm, "think think think"), rm_score(rm, "7 <|im_end|>")
    assert best > plain + 2  # the RM prefers the target word
    overrides = toy_overrides(
        toy_data,
        tiny_model,
        tmp_path,
        trainer__total_training_steps=STEPS,
        reward_model__enable=True,
        reward_model__model__path=rm,
        reward_model__micro_batch_size_per_gpu=32,
    ) + ["+reward_model.mix={rule: 0, rm: 1}"]
    summary, rows, _ = fit("grpo", overrides, tmp_path / "logs")
    steps = train_rows(rows)
    assert len(steps) == STEPS == summary.steps
    rm_means = [r["reward/rm/mean"] for r in steps]
    first, last = statistics.fmean(rm_means[:5]), statistics.fmean(rm_means[-5:])
    print(
        f"RM reward first 5 {first:.3f} -> last 5 {last:.3f} (plain '7' {plain:.3f}, 'think' x3 {best:.3f}); "
        f"median step {statistics.median(summary.step_seconds):.2f}s, "
        f"RM forward {statistics.median(r['timing_s/compute_rm_score'] for r in steps):.3f}s"
    )
    assert last > first + 0.5 * (best - first), (first, last, best)
    # the pure-RM score is the reward the advantages were computed from; no rule scorer ran
    assert all(abs(r["critic/score/mean"] - r["reward/rm/mean"]) < 1e-4 for r in steps)
    assert "reward/rule/mean" not in steps[-1] and "timing_s/compute_rm_score" in steps[-1]
