"""Tiny reward models and tokenizers for the reward-model tests (built locally, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

from rlkit.protocol import Batch
from rlkit.testing import DIGITS, WORDS, build_tiny_tokenizer, save_tiny_reward_model

#: a chat template unlike the policy's ChatML-style one: other markers, other order of role and text
OTHER_TEMPLATE = (
    "<s> {% for message in messages %}{{ '[ ' + message['role'] + ' ] ' + message['content'] + ' </s> ' }}{% endfor %}"
)


def build_other_tokenizer():
    """A second word-level tokenizer: the same words in another id order (so the policy's ids mean other
    words here) and another chat template."""
    words = list(dict.fromkeys(list(reversed(WORDS + DIGITS)) + ["[", "]"]))
    return build_tiny_tokenizer(words, chat_template=OTHER_TEMPLATE, eos_token="</s>", padding_side="right",
                                special_tokens=())


def save_rm(path: Path, tokenizer=None, seed: int = 0) -> Path:
    return save_tiny_reward_model(path, tokenizer=tokenizer, seed=seed)


def plain_scores(rm_path: Path, rows: list[list[int]]) -> torch.Tensor:
    """The reference: transformers' AutoModelForSequenceClassification on each row alone (no padding)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(rm_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.tensor([float(model(input_ids=torch.tensor([r])).logits[0, 0]) for r in rows])


def policy_batch(
    prompts: list[str], responses: list[str], prompt_length: int = 16, response_length: int = 6, eos: bool = True
) -> Batch:
    """A rollout-shaped batch from texts with the tiny (policy) tokenizer: left-padded chat prompts, right-padded
    responses (each ending with EOS when `eos`), raw_prompt messages, data_source toy."""
    tok = build_tiny_tokenizer()
    messages = [[{"role": "user", "content": p}] for p in prompts]
    texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    enc = tok(texts, padding="max_length", max_length=prompt_length, return_tensors="pt", add_special_tokens=False)
    rows = []
    for r in responses:
        ids = tok(r, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
        rows.append(ids[:response_length])
    resp = torch.full((len(rows), response_length), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(resp)
    for i, ids in enumerate(rows):
        resp[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    attention = torch.cat([enc["attention_mask"], mask], 1)
    return Batch(
        {
            "prompts": enc["input_ids"],
            "responses": resp,
            "response_mask": mask,
            "input_ids": torch.cat([enc["input_ids"], resp], 1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
        },
        {
            "raw_prompt": messages,
            "data_source": ["rlkit/toy_copy"] * len(rows),
            "reward_model": [{"style": "rule", "ground_truth": p.split(":")[-1].strip()} for p in prompts],
        },
    )
