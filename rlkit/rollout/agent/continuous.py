"""`ContinuousServer`: the agent loop's turns served by continuous batching (`rollout.mode=async`).

The tick-batching `BatchingServer` merges the pending turns into one `generate` call per
tick, so a short turn waits for the longest one of its tick and a conversation back from a
slow tool waits for the next tick. Here every turn is submitted to the in-process vLLM
engine the moment its conversation sends it (token ids in, `TokensPrompt`), and vLLM's
scheduler batches whatever is in flight step by step: a finished request is resolved at
once while the others keep decoding, and a new one joins at the next step.

Why not vLLM's `AsyncLLM`: it always talks to a separate engine-core process (its client is
`make_async_mp_client`, even with `VLLM_ENABLE_V1_MULTIPROCESSING=0`: measured on vLLM 0.32,
it spawns an EngineCore), so the in-process weight sync (`reload_weights` from a generator),
sleep/wake and LoRA of `VLLMRollout` would not reach it. This server drives the *same*
`LLMEngine` the `VLLMRollout` owns (`add_request` + `step` on one engine thread), so those work
unchanged. The engine thread stops, and nothing is in flight, when `shutdown` returns: the
rollout worker may then sync weights or put the engine to sleep.

Reproducible sampling: request (sample i, turn t) uses seed `row_seed(row_seed(seed, i), t)`,
whatever the order in which requests reach the engine. Prefix caching (vLLM's default for
generative models) lets turn t+1 reuse the KV of the context it shares with turn t;
`agent/prefix_cache_hit` reports the share of prompt tokens served from the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rlkit.config.rollout import RolloutConfig
from rlkit.rollout.agent.engine import ENGINE_SERVERS, AsyncEngine, ServerStats, TurnOutput, TurnRequest
from rlkit.rollout.base import RolloutBackend, SamplingConfig
from rlkit.rollout.vllm_rollout import VLLMRollout, row_seed
from rlkit.utils.once import Once

logger = logging.getLogger(__name__)
_STOP = object()  # tells the engine thread to abort what is left and exit


@dataclass
class _Pending:
    request: TurnRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def turn_seed(seed: int, sample_index: int, turn: int) -> int:
    """The sampling seed of one turn: fixed by (seed, sample, turn), not by when the turn is scheduled."""
    return row_seed(row_seed(seed, sample_index), turn)


def _settle(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():  # the conversation was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _settle_from_thread(item: _Pending, value: Any, error: BaseException | None = None) -> None:
    """Resolve a conversation's future on its event loop (gone already when an earlier failure ended the run)."""
    with contextlib.suppress(RuntimeError):  # "Event loop is closed"
        item.loop.call_soon_threadsafe(_settle, item.future, value, error)


class ContinuousServer:
    """`AsyncEngine` over the in-process vLLM engine of a `VLLMRollout`; see the module docstring."""

    def __init__(self, backend: VLLMRollout, sampling: SamplingConfig, extra_stop_ids: Sequence[int] = ()) -> None:
        if backend.asleep:  # the scheduler is paused until every part is awake: nothing would finish
            raise RuntimeError(
                f"generate on a sleeping engine ({', '.join(sorted(backend.asleep))} asleep); "
                "EngineLifecycle wakes it before generating"
            )
        self.backend, self.engine = backend, backend.llm.llm_engine
        stops = [*sampling.stop_token_ids, *extra_stop_ids]
        self.sampling = replace(sampling, stop_token_ids=list(dict.fromkeys(stops)))
        self.stop_ids = list(dict.fromkeys([*stops, *backend.stop_ids]))
        self.stats = ServerStats()
        self.prefix_caching = bool(self.engine.vllm_config.cache_config.enable_prefix_caching)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._active = 0
        self._threads = torch.get_num_threads()  # the engine thread uses the caller's intra-op thread count
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failed: BaseException | None = None  # set when the engine thread ends; later requests fail with it

    # ------------------------------------------------------------ AsyncEngine
    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        self._active += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._active)
        try:
            yield
        finally:
            self._active -= 1

    async def generate(self, request: TurnRequest) -> TurnOutput:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._failed is not None:
                raise self._failed
            self._ensure_started()
            self._inbox.put(_Pending(request, loop, future))
        return await future

    async def aclose(self) -> None:
        """Nothing to do per event loop; `shutdown` stops the engine thread."""

    @property
    def last_call_s(self) -> float:
        return 0.0

    def shutdown(self) -> None:
        """Abort whatever is still in flight, stop the engine thread and wait for it: the engine is idle after."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            self._inbox.put(_STOP)
            thread.join()

    # ---------------------------------------------------------- engine thread
    def _ensure_started(self) -> None:
        """Start the engine thread (under `_lock`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlkit-agent-engine", daemon=True)
            self._thread.start()

    def _params(self, request: TurnRequest):
        from vllm.sampling_params import RequestOutputKind

        seed = self.sampling.seed
        sampling = replace(self.sampling, response_length=request.max_tokens)
        params = self.backend._sampling_params(  # the backend's own mapping (greedy, log-probs, stops)
            sampling, None if seed is None else turn_seed(seed, request.sample_index, request.turn)
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY  # only finished requests come back from `step`
        return params

    def _run(self) -> None:
        """Add what arrived, step, resolve what finished; block on the inbox when nothing is in flight."""
        torch.set_num_threads(self._threads)
        in_flight: dict[str, _Pending] = {}
        error: BaseException = RuntimeError("the agent engine server was shut down")
        try:
            while self._admit(in_flight):
                if not in_flight:
                    continue
                self.stats.max_concurrency = max(self.stats.max_concurrency, len(in_flight))
                self.stats.batch_sizes.append(len(in_flight))
                start = time.perf_counter()
                outputs = self.engine.step()
                self.stats.gen_s += time.perf_counter() - start
                self.stats.ticks += 1
                for out in outputs:
                    if out.finished and out.request_id in in_flight:
                        self._resolve(in_flight.pop(out.request_id), out)
        except BaseException as exc:  # an engine failure fails every waiting conversation
            error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            with self._lock:
                self._failed = error
                waiting = list(in_flight.values())
                while True:  # requests that had not reached the engine yet
                    try:
                        item = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    if item is not _STOP:
                        waiting.append(item)
            if in_flight:  # stopped with requests in flight (cancelled, or a failure): leave the engine idle
                with contextlib.suppress(Exception):
                    self.engine.abort_request(list(in_flight))
            for item in waiting:
                _settle_from_thread(item, None, error)

    def _admit(self, in_flight: dict[str, _Pending]) -> bool:
        """Add every request waiting in the inbox to the engine (block for one when idle); False on stop."""
        from vllm import TokensPrompt

        block = not in_flight
        while True:
            try:
                item = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if item is _STOP:
                return False
            rid = f"rlkit-agent-{next(self._ids)}"
            prompt = TokensPrompt(prompt_token_ids=list(item.request.prompt_ids))
            try:
                self.engine.add_request(rid, prompt, self._params(item.request), lora_request=self.backend.lora_request)
            except Exception as exc:  # a request the engine refuses (bad sampling values) fails its conversation
                _settle_from_thread(item, None, exc)
                continue
            in_flight[rid] = item
            self.stats.calls += 1

    def _resolve(self, item: _Pending, out: Any) -> None:
        completion = out.outputs[0]
        ids = list(completion.token_ids)[: item.request.max_tokens]
        log_probs = None
        if completion.logprobs is not None:
            log_probs = [step[t].logprob for step, t in zip(completion.logprobs, ids)]
        self.stats.tokens += len(ids)
        self.stats.prompt_tokens += len(item.request.prompt_ids)
        self.stats.cached_tokens += int(out.num_cached_tokens or 0)
        result = TurnOutput(ids, log_probs, stopped=bool(ids) and ids[-1] in set(self.stop_ids))
        _settle_from_thread(item, result)


_warned_fallback = Once()


@ENGINE_SERVERS.register("async")
def continuous_server(
    backend: RolloutBackend,
    sampling: SamplingConfig,
    extra_stop_ids: Sequence[int],
    config: RolloutConfig,
    last_call_s: float,
) -> AsyncEngine:
    """`mode=async`: continuous batching on a vLLM engine; other backends keep tick batching (logged once)."""
    if isinstance(backend, VLLMRollout):
        return ContinuousServer(backend, sampling, extra_stop_ids)
    name = type(backend).__name__
    if _warned_fallback.first(name):
        logger.warning(
            "actor_rollout_ref.rollout.mode=async: %s has no continuous-batching engine; the agent "
            "loop's turns are tick-batched as with mode=sync",
            name,
        )
    return ENGINE_SERVERS.get("sync")(backend, sampling, extra_stop_ids, config, last_call_s)


__all__ = ["ContinuousServer", "continuous_server", "turn_seed"]
