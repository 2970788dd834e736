"""The async generation interface of the agent loop, and a batching server over any rollout backend.

Each conversation is a coroutine that awaits `engine.generate(TurnRequest)` once
per turn (token ids in, token ids out). `BatchingServer` turns these concurrent
single requests into batched calls of a token-in/token-out `RolloutBackend`
(HF or vLLM): every tick it gathers the pending requests of all conversations,
waiting at most `wait_s` for conversations that are still running tools, and
runs one `backend.generate` on a dedicated thread, so tools of some samples run
while the others generate. The wait grows to a quarter of the last generate call
when that is longer: on a slow engine a straggler is worth waiting for. Requests
whose context + budget would not fit the engine's context window together are
split into several calls of the tick.

`ENGINE_SERVERS` maps `actor_rollout_ref.rollout.mode` to the server an agent rollout runs against:
`sync` is the `BatchingServer` here, `async` the continuous-batching server of
rlkit/rollout/agent/continuous.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from rlkit.config.rollout import RolloutConfig
from rlkit.protocol import Batch
from rlkit.registry import Registry
from rlkit.rollout.base import RolloutBackend, SamplingConfig

WAIT_FRACTION = 0.25  # of the last generate call's duration, see BatchingServer._serve


@dataclass
class TurnRequest:
    prompt_ids: list[int]  # the whole context so far (prompt + earlier turns), unpadded
    max_tokens: int
    sample_index: int = 0
    turn: int = 0


@dataclass
class TurnOutput:
    token_ids: list[int]
    log_probs: list[float] | None = None
    stopped: bool = False  # ended on a stop token (else: ran out of max_tokens)


class AsyncEngine(Protocol):
    stop_ids: list[int]  # tokens that end a turn (EOS, and the tool-call end marker when configured)

    async def generate(self, request: TurnRequest) -> TurnOutput: ...

    def session(self) -> contextlib.AbstractAsyncContextManager: ...


@dataclass
class ServerStats:
    """What a server did in one rollout. A tick is one engine call (tick batching) or one engine step
    (continuous batching); `batch_sizes` are the requests each tick served."""

    ticks: int = 0
    calls: int = 0  # engine calls (tick batching) or turn requests (continuous batching)
    batch_sizes: list[int] = field(default_factory=list)
    max_in_flight: int = 0  # most conversations alive at once
    max_concurrency: int = 0  # most turn requests inside the engine at once
    gen_s: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0  # continuous batching: context tokens of the requests, and those the prefix cache held
    cached_tokens: int = 0

    def metrics(self) -> dict[str, float]:
        sizes = self.batch_sizes or [0]
        out = {
            "agent/gen_calls": float(self.calls),
            "agent/batch_size/mean": float(sum(sizes) / len(sizes)),
            "agent/batch_size/max": float(max(sizes)),
            "agent/in_flight/max": float(self.max_in_flight),
            "agent/engine_max_concurrency": float(max(self.max_concurrency, *sizes)),
            "agent/gen_tokens_per_s": self.tokens / self.gen_s if self.gen_s > 0 else 0.0,
        }
        if self.prompt_tokens:
            out["agent/prefix_cache_hit"] = self.cached_tokens / self.prompt_tokens
        return out


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> Batch:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r) :] = 1
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def plan_groups(requests: Sequence[TurnRequest], context_limit: int | None) -> list[list[int]]:
    """Split a tick into generate calls: each call uses its largest budget, which must fit every row's context."""
    order = sorted(range(len(requests)), key=lambda i: -requests[i].max_tokens)
    if context_limit is None:
        return [order]
    groups: list[list[int]] = []
    left = order
    while left:
        budget = requests[left[0]].max_tokens
        fits = [i for i in left if len(requests[i].prompt_ids) + budget <= context_limit]
        group = fits or left[:1]
        groups.append(group)
        chosen = set(group)
        left = [i for i in left if i not in chosen]
    return groups


class BatchingServer:
    """`AsyncEngine` over a batched `RolloutBackend`. Use inside one event loop; see the module docstring."""

    def __init__(
        self,
        backend: RolloutBackend,
        sampling: SamplingConfig,
        extra_stop_ids: Sequence[int] = (),
        wait_s: float = 0.02,
        context_limit: int | None = None,
        pad_id: int | None = None,
        last_call_s: float = 0.0,
    ) -> None:
        self.backend = backend
        self.sampling = sampling
        backend_stops = list(getattr(backend, "stop_ids", []) or [])
        self.stop_ids = list(dict.fromkeys([*sampling.stop_token_ids, *backend_stops, *extra_stop_ids]))
        self.extra_stop_ids = list(extra_stop_ids)
        self.wait_s = wait_s
        self.context_limit = context_limit
        self.pad_id = int(pad_id if pad_id is not None else getattr(backend, "pad_id", 0))
        self.stats = ServerStats()
        self._last_call_s = last_call_s  # duration of the latest generate call (a previous server's, at first)
        self._pending: list[tuple[TurnRequest, asyncio.Future]] = []
        self._active = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        threads = torch.get_num_threads()  # the generation thread uses the caller's intra-op thread count
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rlkit-agent-gen", initializer=torch.set_num_threads, initargs=(threads,)
        )

    # ------------------------------------------------------------ sessions
    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        """One conversation: the server knows how many could still send a request this tick."""
        self._ensure_started()
        self._active += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._active)
        try:
            yield
        finally:
            self._active -= 1
            self._poke()

    async def generate(self, request: TurnRequest) -> TurnOutput:
        self._ensure_started()
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((request, fut))
        self._poke()
        return await fut

    @property
    def last_call_s(self) -> float:
        return self._last_call_s

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)

    # --------------------------------------------------------------- server
    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wakeup = asyncio.Event()
            self._task = loop.create_task(self._serve(), name="rlkit-batching-server")

    def _poke(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending:
                continue
            # wait for conversations still in their tools: `wait_s`, or a quarter of the last generate call
            # when that is longer (a straggler joining now is cheaper than an extra call of its own)
            deadline = loop.time() + max(self.wait_s, WAIT_FRACTION * self._last_call_s)
            while len(self._pending) < self._active and loop.time() < deadline:
                self._wakeup.clear()
                with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), deadline - loop.time())
            batch, self._pending = self._pending, []
            self.stats.ticks += 1
            try:
                outs = await loop.run_in_executor(self._executor, self._generate, [r for r, _ in batch])
            except Exception as exc:  # an engine failure fails every waiting conversation
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), out in zip(batch, outs):
                if not fut.done():
                    fut.set_result(out)

    def _generate(self, requests: list[TurnRequest]) -> list[TurnOutput]:
        """Runs on the generation thread: one backend call per group of the tick."""
        outs: list[TurnOutput | None] = [None] * len(requests)
        stops = set(self.stop_ids)
        for group in plan_groups(requests, self.context_limit):
            rows = [requests[i] for i in group]
            budget = max(r.max_tokens for r in rows)
            seed = self.sampling.seed
            if seed is not None:
                seed = (seed + 7919 * self.stats.calls) % 2**31
            sampling = replace(
                self.sampling,
                response_length=budget,
                seed=seed,
                stop_token_ids=list(dict.fromkeys([*self.sampling.stop_token_ids, *self.extra_stop_ids])),
            )
            start = time.perf_counter()
            result = self.backend.generate(left_pad([r.prompt_ids for r in rows], self.pad_id), sampling)
            self._last_call_s = time.perf_counter() - start
            self.stats.gen_s += self._last_call_s
            self.stats.calls += 1
            self.stats.batch_sizes.append(len(rows))
            mask = result["response_mask"].bool()
            lps = result.tensors.get("rollout_log_probs")
            for k, (i, req) in enumerate(zip(group, rows)):
                ids = result["responses"][k][mask[k]].tolist()[: req.max_tokens]
                lp = lps[k][mask[k]].tolist()[: req.max_tokens] if lps is not None else None
                self.stats.tokens += len(ids)
                outs[i] = TurnOutput(ids, lp, stopped=bool(ids) and ids[-1] in stops)
        return outs  # type: ignore[return-value]


EngineServerFactory = Callable[[RolloutBackend, SamplingConfig, Sequence[int], RolloutConfig, float], AsyncEngine]
#: `actor_rollout_ref.rollout.mode` -> a factory of the server one agent rollout runs against:
#: (backend, sampling, extra stop ids, rollout config, the previous server's last call duration).
#: "sync" is here; "async" (continuous batching) in rlkit/rollout/agent/continuous.py.
ENGINE_SERVERS: Registry[EngineServerFactory] = Registry("rollout mode", fill=("rlkit.rollout.agent.continuous",))


@ENGINE_SERVERS.register("sync")
def batching_server(
    backend: RolloutBackend,
    sampling: SamplingConfig,
    extra_stop_ids: Sequence[int],
    config: RolloutConfig,
    last_call_s: float,
) -> AsyncEngine:
    """`mode=sync`: tick batching over any backend's `generate`."""
    return BatchingServer(
        backend,
        sampling,
        extra_stop_ids,
        wait_s=config.multi_turn.batch_wait_ms / 1000,
        context_limit=config.model_len,
        last_call_s=last_call_s,
    )
