"""Per-step data metrics under the field's usual names (critic/score/mean, response_length/mean, ...)."""

from __future__ import annotations

import torch

from rlkit.protocol import Batch


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.detach().float()
    if x.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


def _valid(batch: Batch, key: str, mask: torch.Tensor) -> torch.Tensor:
    return batch[key][mask.bool()]


def compute_data_metrics(batch: Batch) -> dict[str, float]:
    """Scores, greedy baselines, rewards, advantages, returns, values (valid tokens only), lengths: keys present.

    Response length counts the response part of `attention_mask` when the batch
    holds prompt+response masks (tool tokens count toward length, not toward training),
    else `response_mask`. clip_ratio is the share of responses that hit the length limit.
    """
    out: dict[str, float] = {}
    mask = batch["response_mask"]
    width = mask.shape[-1]
    if "token_level_scores" in batch:
        out.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    if "reward_baselines" in batch:  # ReMax: the reward of the greedy response to each row's prompt
        out.update(_stats("critic/reward_baseline", batch["reward_baselines"]))
    if "reward_extra/acc" in batch:  # correctness alone (gsm8k, math, code scorers), without format bonuses
        acc = [float(a) for a in batch["reward_extra/acc"] if a is not None]
        if acc:
            out["reward/acc/mean"] = sum(acc) / len(acc)
    if "token_level_rewards" in batch:
        out.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    for key, name in (("advantages", "critic/advantages"), ("returns", "critic/returns"), ("values", "critic/values")):
        if key in batch:
            out.update(_stats(name, _valid(batch, key, mask)))

    attn = batch.tensors.get("attention_mask")
    if attn is not None and attn.shape[-1] > width:
        resp_len, prompt_len = attn[:, -width:].sum(-1), attn[:, :-width].sum(-1)
    else:
        resp_len, prompt_len = mask.sum(-1), None
    out.update(_stats("response_length", resp_len))
    if resp_len.numel():
        out["response_length/clip_ratio"] = float((resp_len == width).float().mean())
    if prompt_len is not None:
        out.update(_stats("prompt_length", prompt_len))
    return out
