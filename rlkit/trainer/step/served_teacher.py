"""A teacher behind an OpenAI-compatible `/completions` endpoint that returns prompt log-probs (vLLM's server).

Each sample is one request: the prompt + response token ids as the prompt, `max_tokens=1`, `echo` and
`prompt_logprobs` on; the reply's log-prob of each prompt position is read from `choices[0].prompt_logprobs`
(vLLM: a list of {token_id: {logprob}} per position, None first) or, failing that, from the echoed
`choices[0].logprobs.token_logprobs`. The server applies no temperature to prompt log-probs: the served
teacher's are at temperature 1.

Requests run concurrently (at most `concurrency` in flight), each attempt bounded by `timeout_s`; timeouts,
connection errors, 5xx, 408 and 429 are retried `retries` times with exponential backoff, as the judge's HTTP
backend does (rlkit/reward/judge_backends.py). A request that still fails, or a reply without the log-probs
of every position, costs its sample only: `Scored.error` says why, and the caller masks the sample out and
counts it; it never raises.
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass
from typing import Any

from rlkit.config.distillation import TeacherModelConfig
from rlkit.errors import UserError
from rlkit.utils.async_run import run_coroutine
from rlkit.utils.network import post_with_retries


@dataclass
class Scored:
    """The teacher's log-prob of each token of one request (None on failure, with `error`)."""

    log_probs: list[float] | None = None
    error: str | None = None
    attempts: int = 1


class ServedTeacher:
    def __init__(self, cfg: TeacherModelConfig, where: str) -> None:
        try:
            import httpx
        except ImportError:
            raise UserError(f"{where}.base_url: a served teacher needs httpx: pip install httpx") from None
        self.httpx, self.cfg = httpx, cfg
        base = cfg.base_url.rstrip("/")
        self.url = base if base.endswith("/completions") else base + "/completions"
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def score(self, sequences: list[list[int]]) -> list[Scored]:
        """Log-probs of every token but the first of each id sequence (position i: log p(ids[i] | ids[:i]))."""
        return run_coroutine(self._score_all(sequences))

    async def _score_all(self, sequences: list[list[int]]) -> list[Scored]:
        n = self.cfg.concurrency
        gate = asyncio.Semaphore(n)
        limits = self.httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with self.httpx.AsyncClient(headers=self.headers, limits=limits, timeout=None) as client:
            return list(await asyncio.gather(*(self._score_one(client, gate, ids) for ids in sequences)))

    async def _score_one(self, client: Any, gate: asyncio.Semaphore, ids: list[int]) -> Scored:
        cfg = self.cfg
        payload = {"model": cfg.model_path, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "echo": True,
                   "logprobs": 0, "prompt_logprobs": 0}
        posted = await post_with_retries(client, gate, self.httpx, self.url, payload, timeout_s=cfg.timeout_s,
                                          retries=cfg.retries, backoff_s=cfg.retry_backoff_s)
        if posted.reply is None:
            return Scored(error=posted.error, attempts=posted.attempts)
        if posted.reply.status_code >= 400:
            return Scored(error=f"http {posted.reply.status_code}", attempts=posted.attempts)
        return _parse(posted.reply, ids, posted.attempts)


def _parse(reply: Any, ids: list[int], attempts: int) -> Scored:
    """The log-probs of ids[1:] from a reply, or an error naming what was missing."""
    try:
        choice = reply.json()["choices"][0]
        per_position = choice.get("prompt_logprobs")
        if per_position is not None:
            values = [_entry(per_position[i], tok) for i, tok in enumerate(ids) if i > 0]
        else:
            values = [float(v) for v in choice["logprobs"]["token_logprobs"][1:len(ids)]]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return Scored(error=f"bad reply: {type(exc).__name__}", attempts=attempts)
    if len(values) != len(ids) - 1 or not all(math.isfinite(v) for v in values):
        return Scored(error=f"bad reply: {len(values)} log-probs for {len(ids) - 1} tokens", attempts=attempts)
    return Scored(log_probs=values, attempts=attempts)


def _entry(position: dict, token: int) -> float:
    """vLLM's prompt_logprobs entry of one position: {str(token_id): {"logprob": x, ...}} (or a bare float)."""
    value = position[str(token)]
    return float(value["logprob"] if isinstance(value, dict) else value)
