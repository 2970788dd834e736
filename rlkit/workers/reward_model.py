"""The classifier reward model: a frozen FSDP2 `AutoModelForSequenceClassification` (one label) that scores samples.

`RewardModelScorer` is the model and its micro-batched forward, usable without Ray (`rlkit reward
score --reward-model`); `RewardModelWorker` is the worker role (`reward_model.enable=true`,
`style=classifier`) that the trainer calls with `compute_rm_score(batch)`, dispatched over the data-
parallel ranks. What the RM reads is built by rlkit.reward.rm_inputs (the policy's tokens, or the
responses re-templated for the RM's own tokenizer).

The score is read at each row's last real token from the model's per-token head output (`score`,
captured by a forward hook), not from transformers' pooling, which finds "the last non-pad token" by
comparing ids with pad_token_id and so misses a response that ends in an EOS equal to the pad token.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch

from rlkit.config.reward_model import RewardModelConfig
from rlkit.controller import Dispatch, Worker, register
from rlkit.debug import maybe_break
from rlkit.errors import UserError
from rlkit.protocol import METRICS_KEY, Batch
from rlkit.reward.placement import on_last_token
from rlkit.reward.rm_inputs import RMInputs, pack, policy_token_rows, retemplated_rows, text_rows
from rlkit.utils.memory_peak import rss_bytes
from rlkit.utils.tokens import pad_token_id
from rlkit.workers.fsdp_model import FSDPModel

SCORE_HEAD = "score"  # the token-level head of transformers' *ForSequenceClassification decoders


class RewardModelScorer:
    """A frozen sequence-classification RM. `cfg.model.path` (and `input_tokenizer`) are local folders."""

    def __init__(self, cfg: RewardModelConfig, device: torch.device) -> None:
        from rlkit.models.loading import load_tokenizer

        self.cfg = cfg
        m = cfg.model
        if not m.path:
            raise UserError("reward_model.model.path is not set: give the reward model's folder, hub id or alias")
        from transformers import AutoConfig

        labels = AutoConfig.from_pretrained(m.path, trust_remote_code=m.trust_remote_code).num_labels
        if labels != 1:
            raise UserError(
                f"reward_model.model.path={m.path}: the model has num_labels={labels}; a reward "
                "model has one label (a scalar score)"
            )
        self.model = FSDPModel(
            m.path,
            dataclasses.replace(m.fsdp_config, dither_master_weights=False),  # frozen: never updated, no dither
            device,
            attn_implementation=m.attn_implementation,
            trust_remote_code=m.trust_remote_code,
            auto_class="AutoModelForSequenceClassification",
        )
        module = self.model.module
        head = getattr(module, SCORE_HEAD, None)
        if not isinstance(head, torch.nn.Module):
            raise UserError(
                f"reward_model.model.path={m.path}: {type(module).__name__} has no per-token `score` "
                "head; rlkit reads decoder reward models (Llama/Qwen2/Mistral/Gemma ...ForSequence"
                "Classification)"
            )
        self._captured: list[torch.Tensor] = []
        head.register_forward_hook(lambda _mod, _inp, out: self._captured.append(out))
        for p in module.parameters():
            p.requires_grad_(False)
        module.eval()
        self.rm_tokenizer = load_tokenizer(m.path)
        self.input_tokenizer = load_tokenizer(m.input_tokenizer) if m.input_tokenizer else None
        self.pad_token_id = pad_token_id(self.rm_tokenizer, module.config.pad_token_id, where=f"reward model {m.path}")

    # ---------------------------------------------------------------- inputs
    def batch_rows(self, batch: Batch) -> list[list[int]]:
        """A rollout batch's rows as the RM's token lists (rlkit.reward.rm_inputs)."""
        if self.input_tokenizer is None:
            return policy_token_rows(
                batch["input_ids"], batch["attention_mask"], batch["response_mask"], self.cfg.max_length
            )
        if "raw_prompt" not in batch:
            raise UserError(
                "reward_model.model.input_tokenizer is set but the batch has no raw_prompt (the prompt "
                "messages the RM's chat template is applied to)"
            )
        return retemplated_rows(
            self.input_tokenizer,
            self.rm_tokenizer,
            batch["raw_prompt"],
            batch["responses"],
            batch["response_mask"],
            self.cfg.max_length,
        )

    def text_rows(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[list[int]]:
        """Prompts (strings or message lists) + response texts, rendered with the RM's chat template."""
        return text_rows(self.rm_tokenizer, prompts, responses, self.cfg.max_length)

    # --------------------------------------------------------------- forward
    @torch.no_grad()
    def score_rows(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """(B,) float32: each row's score at its last token, micro_batch_size_per_gpu rows per forward."""
        if not rows:
            return torch.zeros(0)
        inputs = pack(rows, self.pad_token_id)
        micro = self.cfg.micro_batch_size_per_gpu
        out = [self._forward(inputs.rows(i, min(i + micro, len(inputs)))) for i in range(0, len(inputs), micro)]
        return torch.cat(out)

    def _forward(self, mb: RMInputs) -> torch.Tensor:
        device = self.model.device
        self._captured.clear()
        with self.model.computing():
            self.model.module(
                input_ids=mb.input_ids.to(device),
                attention_mask=mb.attention_mask.to(device),
                position_ids=mb.position_ids.to(device),
                use_cache=False,
            )
        per_token = self._captured.pop()[..., 0]  # (b, L): the head's output at every position
        return per_token[torch.arange(len(mb)), mb.last.to(per_token.device)].float().cpu()

    def score_batch(self, batch: Batch) -> torch.Tensor:
        return self.score_rows(self.batch_rows(batch))


class RewardModelWorker(Worker):
    """The `reward_model` role: built colocated with the actor (or on a group of its own), frozen."""

    def __init__(self, reward_model: RewardModelConfig) -> None:
        """`reward_model`: the reward_model section with `model.path` / `model.input_tokenizer` resolved to
        local folders (rlkit.trainer.run.roles.reward_model_role)."""
        super().__init__()
        self.cfg = reward_model

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_distributed()
        self.scorer = RewardModelScorer(self.cfg, self.device)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_rm_score(self, batch: Batch) -> Batch:
        """`rm_scores` (B, R) float32: each row's RM score on its last valid response token."""
        maybe_break("reward_model.compute_rm_score")
        start = time.perf_counter()
        scores = self.scorer.score_batch(batch)
        metrics = {
            "timing_s/compute_rm_score": [time.perf_counter() - start],
            "perf/reward_model_rss_mb": [rss_bytes() / 2**20],  # the whole process (colocated: actor + engine + RM)
        }
        return Batch({"rm_scores": on_last_token(scores, batch["response_mask"])}, meta={METRICS_KEY: metrics})
