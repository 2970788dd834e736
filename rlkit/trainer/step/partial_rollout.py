"""Partial rollouts: one chunk of samples generated in segments, each segment under the engine's weights of the moment.

With `trainer.partial_rollout_segment` = L > 0 the pump asks the engine for at most L new tokens per
request. Between two requests a weight push may land on the rollout worker (it is queued in the
same order as the requests), so an unfinished sample continues from its prompt + the tokens so far
under the new weights (continue, not abort-and-restart: nothing generated is thrown away). Every
response token records the version that sampled it (`token_policy_version`, (B, R) long, -1 on
padding), and `rollout_log_probs` stay the engine's per-token log-probs of the policy that drew
each token, so the trainer's rollout correction (pi_old / pi_rollout per token,
rlkit/algo/rollout_correction.py) weighs every token against the policy that actually sampled it.
The sample's `policy_version` is its first (oldest) token's version: staleness is counted from it.

The continuation request is token-in: prompt ids + generated ids, left-padded (nothing is
re-tokenised), with positions from the attention mask as the dataset builds them. The unfinished
rows of a chunk always have the same number of tokens (each got exactly L per segment), so a
request is one rectangle. Pure tensor code: unit-tested without Ray or an engine.
"""

from __future__ import annotations

import torch

from rlkit.protocol import Batch
from rlkit.rollout.base import assemble_output

PAD_VERSION = -1


class PartialChunk:
    """The state of one chunk's samples between segments (rows = the chunk's prompts x rollout.n)."""

    def __init__(
        self,
        prompts: Batch,
        response_length: int,
        pad_id: int,
        stop_ids: list[int],
        request_keys: list[str] | None = None,
    ) -> None:
        self.prompts = prompts  # the input rows: left-padded input_ids/attention_mask/position_ids (+ non-tensors)
        self.request_keys = set(request_keys or [])  # non-tensor keys the engine reads (the agent loop's)
        self.start_version: int | None = None  # the version of the first segment (the oldest tokens')
        self.response_length, self.pad_id, self.stop_ids = response_length, pad_id, set(stop_ids)
        rows = len(prompts)
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.log_probs: list[list[float]] = [[] for _ in range(rows)]
        self.versions: list[list[int]] = [[] for _ in range(rows)]
        self.done = [False] * rows
        self.segments = 0
        self.seq = 0  # start order among chunks (set by the pump)

    @property
    def finished(self) -> bool:
        return all(self.done)

    def pending(self) -> list[int]:
        return [i for i, d in enumerate(self.done) if not d]

    def request(self, segment: int) -> tuple[Batch, list[int], int]:
        """The next request: (input rows for the unfinished samples, their row indices, max new tokens).
        `segment` 0 asks for the whole remaining response."""
        rows = self.pending()
        done_len = len(self.tokens[rows[0]])
        if any(len(self.tokens[i]) != done_len for i in rows):
            raise RuntimeError("partial rollout: unfinished rows of one chunk hold different token counts")
        left = self.response_length - done_len
        max_tokens = left if segment <= 0 else min(segment, left)
        ids = self.prompts["input_ids"][rows]
        mask = self.prompts["attention_mask"][rows]
        if done_len:
            new = torch.tensor([self.tokens[i] for i in rows], dtype=ids.dtype)
            ids = torch.cat([ids, new], dim=1)
            mask = torch.cat([mask, torch.ones_like(new, dtype=mask.dtype)], dim=1)
        position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
        req = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids})
        for key, value in self.prompts.non_tensors.items():
            if key in self.request_keys:
                req.non_tensors[key] = value[rows]
        return req, rows, max_tokens

    def add(self, rows: list[int], out: Batch, version: int, max_tokens: int) -> None:
        """Append one segment's output (rows of `out` = `rows`) generated under `version`."""
        self.segments += 1
        if self.start_version is None:
            self.start_version = version
        lengths = out["response_mask"].sum(dim=1).tolist()
        lps = out["rollout_log_probs"] if "rollout_log_probs" in out else None
        for j, i in enumerate(rows):
            n = int(lengths[j])
            new = out["responses"][j, :n].tolist()
            self.tokens[i] += new
            self.log_probs[i] += lps[j, :n].tolist() if lps is not None else [0.0] * n
            self.versions[i] += [version] * n
            stopped = n < max_tokens or (n > 0 and new[-1] in self.stop_ids)
            self.done[i] = stopped or len(self.tokens[i]) >= self.response_length

    def assemble(self) -> Batch:
        """The chunk as a rollout output (rlkit/rollout/base.py layout) + `token_policy_version` (B, R) and
        `policy_version` (B,), both long."""
        rows, length = len(self.tokens), self.response_length
        responses = torch.full((rows, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, length), dtype=torch.long)
        log_probs = torch.zeros((rows, length), dtype=torch.float32)
        versions = torch.full((rows, length), PAD_VERSION, dtype=torch.long)
        for i in range(rows):
            n = len(self.tokens[i])
            responses[i, :n] = torch.tensor(self.tokens[i], dtype=torch.long)
            mask[i, :n] = 1
            log_probs[i, :n] = torch.tensor(self.log_probs[i], dtype=torch.float32)
            versions[i, :n] = torch.tensor(self.versions[i], dtype=torch.long)
        prompts = self.prompts.select(["input_ids", "attention_mask", "position_ids"])
        out = assemble_output(prompts, responses, mask, log_probs)
        out.non_tensors.update(self.prompts.non_tensors)
        out["token_policy_version"] = versions
        out["policy_version"] = sample_versions(versions, self.start_version)
        return out


def sample_versions(token_versions: torch.Tensor, empty: int | None = None) -> torch.Tensor:
    """Each row's oldest token version; a row without tokens gets `empty` (the chunk's first version)."""
    big = torch.iinfo(token_versions.dtype).max
    oldest = torch.where(token_versions >= 0, token_versions, big).min(dim=1).values
    return torch.where(oldest == big, PAD_VERSION if empty is None else empty, oldest)
