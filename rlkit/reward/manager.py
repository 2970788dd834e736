"""RewardManager: decode responses, score them by data_source, place the score on
the last response token.

Scorers run in worker threads (code scorers wait on subprocesses, math scorers
can be slow) with a per-sample timeout. A scorer that raises or runs past the
timeout costs that sample a 0 and one logged error; the batch always completes.
A timed-out thread cannot be killed: it is abandoned (daemon) and frees its slot,
so a stuck scorer never stalls the batch; sandboxed code still dies at its own
wall limit. A scorer that enters `breakpoint()` is never timed out: pdb opens in the
terminal of the driver (where rewards are computed) and waits for you.

A user's custom function that fails on every sample of a batch is a bug in the function
or its config, not a bad sample: that stops the run with a UserError instead of training
on all-zero rewards.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlkit.errors import UserError
from rlkit.protocol import METRICS_KEY, Batch
from rlkit.reward.custom import CustomReward, bind_custom, load_custom_fn
from rlkit.reward.placement import decode_responses, on_last_token
from rlkit.reward.registry import REWARD_MANAGERS, get_scorer, scorer_name_for
from rlkit.utils.once import Once

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

logger = logging.getLogger(__name__)
CUSTOM = "custom"


@dataclass
class SampleScore:
    score: float
    extras: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # None, "timeout" or "<ExceptionType>: message"
    scorer: str = ""


@REWARD_MANAGERS.register("rule", "naive")
class RewardManager:
    """Rule/function-based rewards for a rollout Batch (or for plain texts via `score_texts`): the `rule`
    reward manager (alias `naive`, verl's name), one scorer call per sample.

    scorer_overrides: data_source -> scorer name, on top of `registry.DATA_SOURCES`.
    custom_fn: a callable, or {"path": ..., "name": ...}; when given it scores every row. Its
        signature is checked here (see rlkit.reward.custom for the accepted forms).
    scorer_kwargs: scorer name ("custom" for the custom function) -> keyword arguments.
    """

    def __init__(
        self,
        tokenizer: Any = None,
        scorer_overrides: Mapping[str, str] | None = None,
        custom_fn: Callable[..., Any] | Mapping[str, Any] | None = None,
        num_workers: int = 4,
        timeout_s: float = 10.0,
        scorer_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        label = None
        if isinstance(custom_fn, Mapping):
            path, name = custom_fn.get("path"), custom_fn.get("name") or "compute_score"
            custom_fn = load_custom_fn(path, name) if path else None
            label = f"'{name}' in {path}"
        if num_workers < 1:
            raise UserError(f"reward num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise UserError(f"reward timeout_s must be > 0, got {timeout_s}")
        self.tokenizer = tokenizer
        self.scorer_overrides = dict(scorer_overrides or {})
        self.custom_fn = custom_fn
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.scorer_kwargs = {k: dict(v) for k, v in (scorer_kwargs or {}).items()}
        self.custom: CustomReward | None = (
            bind_custom(custom_fn, self.scorer_kwargs.get(CUSTOM), label) if custom_fn is not None else None
        )
        self._logged = Once()  # (scorer, error kind) pairs already logged

    @classmethod
    def from_config(cls, cfg: RLConfig, tokenizer: Any) -> RewardManager:
        """The manager a run config describes (`reward_model.*`, `custom_reward_function.*`)."""
        return cls(tokenizer, **config_kwargs(cfg))

    def has_scorer(self, data_source: str) -> bool:
        """Whether a row of this data_source gets a scorer (the custom function scores every row). The reward
        mix (rlkit.reward.mix) leaves the rule part out for the others instead of failing."""
        if self.custom is not None:
            return True
        try:
            scorer_name_for(data_source, self.scorer_overrides)
        except UserError:
            return False
        return True

    # ----------------------------------------------------------------- batch
    def __call__(self, batch: Batch) -> Batch:
        return self.compute(batch)

    def compute(self, batch: Batch) -> Batch:
        """A new Batch: `token_level_scores` (B,R), `reward_extra/<name>` and `meta['metrics']`.

        The text scored is the response up to its last `response_mask` token (tool
        tokens in between included), decoded without special tokens. A response with
        no valid token scores as "" and its score sits on position 0.
        """
        if self.tokenizer is None:
            raise UserError("RewardManager.compute needs a tokenizer; use score_texts for decoded text")
        for key in ("responses", "data_source"):
            if key not in batch:
                raise UserError(f"reward: the batch has no '{key}'; keys: {batch.keys()}")
        responses = batch["responses"]
        mask = batch["response_mask"] if "response_mask" in batch else (responses != self.tokenizer.pad_token_id)
        texts = decode_responses(self.tokenizer, responses, mask)
        reward_model = batch["reward_model"] if "reward_model" in batch else [None] * len(batch)
        ground_truths = [rm.get("ground_truth") if isinstance(rm, Mapping) else None for rm in reward_model]
        extra_infos = batch["extra_info"] if "extra_info" in batch else [None] * len(batch)
        data_sources = [str(d) for d in batch["data_source"]]
        results = self.score_texts(texts, ground_truths, data_sources, extra_infos)

        scores = on_last_token(torch.tensor([r.score for r in results]), mask)
        extra_names = sorted({k for r in results for k in r.extras})
        non_tensors = {f"reward_extra/{k}": [r.extras.get(k) for r in results] for k in extra_names}
        return Batch({"token_level_scores": scores}, non_tensors, {METRICS_KEY: summarize(results, data_sources)})

    # ------------------------------------------------------------------ text
    def score_texts(
        self,
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        data_sources: Sequence[str],
        extra_infos: Sequence[Mapping | None] | None = None,
    ) -> list[SampleScore]:
        """Score decoded responses; never raises for a scorer failure (see SampleScore.error)."""
        n = len(responses)
        if not (len(ground_truths) == len(data_sources) == n):
            raise ValueError("score_texts: responses, ground_truths and data_sources differ in length")
        extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
        names = {ds: (CUSTOM if self.custom else scorer_name_for(ds, self.scorer_overrides)) for ds in data_sources}
        fns = {name: (self.custom if name == CUSTOM else get_scorer(name)) for name in set(names.values())}
        calls = [
            self._bind(fns[names[ds]], names[ds], ds, resp, gt, info)
            for resp, gt, ds, info in zip(responses, ground_truths, data_sources, extra_infos)
        ]
        outcomes = _run_with_timeouts(calls, self.num_workers, self.timeout_s)
        results = []
        for ds, (kind, value, tb) in zip(data_sources, outcomes):
            name = names[ds]
            if kind == "ok":
                try:
                    results.append(normalize_score(value, name))
                    continue
                except (TypeError, ValueError) as exc:
                    kind, value, tb = "error", exc, ""
            error = "timeout" if kind == "timeout" else f"{type(value).__name__}: {value}"
            self._log_once(name, ds, error, tb)
            results.append(SampleScore(0.0, {}, error, name))
        if self.custom is not None and results and all(r.error is not None for r in results):
            raise UserError(
                f"custom_reward_function {self.custom.label} failed on all {n} samples of this batch "
                f"(first: {results[0].error}); that is a bug in the function, not a bad sample, so the run stops. "
                "Its first traceback is logged above; try the function on a few rows with "
                "`rlkit reward score ROWS.jsonl --custom-path FILE`"
            )
        return results

    def _bind(self, fn: Callable[..., Any], name: str, data_source: str, response: str, gt: Any, info: Any):
        kwargs = dict(self.scorer_kwargs.get(name, {}))
        info = dict(info) if isinstance(info, Mapping) else info

        def call() -> Any:
            if name == CUSTOM:  # bound by parameter name at start-up; scorer_kwargs are part of the binding
                out = fn(response, gt, info, data_source)
            else:
                out = fn(response, gt, info, **kwargs)
            if inspect.isawaitable(out):
                out = asyncio.run(_await(out))
            return out

        return call

    def _log_once(self, scorer: str, data_source: str, error: str, tb: str) -> None:
        if self._logged.first((scorer, error.split(":", 1)[0])):
            detail = f"\n{tb}" if tb else ""
            logger.warning(
                "reward scorer '%s' failed on data_source '%s' (%s); the sample scores 0. "
                "Later failures of this kind are counted in reward/errors only.%s",
                scorer,
                data_source,
                error,
                detail,
            )


def config_kwargs(cfg: RLConfig) -> dict[str, Any]:
    """RewardManager's arguments from a run config (`reward_model.*`, `custom_reward_function.*`), for the
    managers built on it (dapo, prime)."""
    rm, custom = cfg.reward_model, cfg.custom_reward_function
    return {
        "scorer_overrides": rm.overrides,
        "custom_fn": {"path": custom.path, "name": custom.name} if custom.path else None,
        "num_workers": rm.num_workers, "timeout_s": rm.timeout_s, "scorer_kwargs": rm.scorer_kwargs,
    }


async def _await(awaitable: Any) -> Any:
    return await awaitable


def normalize_score(value: Any, scorer: str) -> SampleScore:
    """float | dict(score=..., **extras) -> SampleScore; anything else is the scorer's error."""
    extras: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"scorer '{scorer}' returned a dict without 'score' (keys: {sorted(value)})")
        extras = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    if not isinstance(value, (bool, int, float, np.bool_, np.number)):
        raise TypeError(f"scorer '{scorer}' returned {type(value).__name__}, expected a float or a dict")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"scorer '{scorer}' returned a non-finite score {score}")
    return SampleScore(score, extras, None, scorer)


RLKIT_DIR = str(Path(__file__).resolve().parents[1]) + os.sep


def user_traceback(exc: BaseException) -> str:
    """The traceback of a scorer's error from its first frame outside rlkit (the user's function) on; whole when
    the error is raised inside rlkit itself."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(RLKIT_DIR):
        tb = tb.tb_next
    if tb is None:
        return "".join(traceback.format_exception(exc))
    return "Traceback (most recent call last):\n" + "".join(
        traceback.format_list(traceback.extract_tb(tb)) + traceback.format_exception_only(exc))


def _run_with_timeouts(calls: Sequence[Callable[[], Any]], workers: int, timeout_s: float) -> list[tuple]:
    """Run calls on at most `workers` daemon threads; each gets `timeout_s` from its own start.

    A call stopped in pdb (a `breakpoint()` in the scorer) is not timed out: someone is debugging it.
    Returns (kind, value, traceback) per call, kind in ok / error / timeout.
    """
    results: list[tuple | None] = [None] * len(calls)
    finished: deque[tuple[int, tuple]] = deque()
    threads: dict[int, int] = {}  # call index -> thread ident
    cond = threading.Condition()

    def work(i: int) -> None:
        threads[i] = threading.get_ident()
        try:
            out = ("ok", calls[i](), "")
        except BaseException as exc:  # a scorer may raise anything, SystemExit included
            out = ("error", exc, user_traceback(exc))
        with cond:
            finished.append((i, out))
            cond.notify()

    pending, running, debugged = deque(range(len(calls))), {}, set()
    while pending or running:
        while pending and len(running) < workers:
            i = pending.popleft()
            running[i] = time.monotonic()
            threading.Thread(target=work, args=(i,), name=f"rlkit-reward-{i}", daemon=True).start()
        with cond:
            timed = [t for i, t in running.items() if i not in debugged]
            if not finished:
                cond.wait(timeout=max(0.0, min(timed) + timeout_s - time.monotonic()) if timed else None)
            done = list(finished)
            finished.clear()
        for i, out in done:
            if running.pop(i, None) is not None:  # a late result of a timed-out call is dropped
                results[i] = out
        now = time.monotonic()
        for i, started in list(running.items()):
            if i in debugged or now - started < timeout_s:
                continue
            if in_debugger(threads.get(i)):
                debugged.add(i)
                continue
            del running[i]
            results[i] = ("timeout", None, "")
    return results  # type: ignore[return-value]


def in_debugger(thread_ident: int | None) -> bool:
    """Whether that thread is stopped in (or stepping under) pdb: a frame on its stack traced by a Bdb."""
    import bdb

    frame = sys._current_frames().get(thread_ident) if thread_ident is not None else None
    while frame is not None:
        if isinstance(getattr(frame.f_trace, "__self__", None), bdb.Bdb):
            return True
        frame = frame.f_back
    return False


def summarize(results: Sequence[SampleScore], data_sources: Sequence[str]) -> dict[str, list[float]]:
    """Batch metrics: error/timeout counts, mean score overall and per data_source."""
    metrics: dict[str, list[float]] = {
        "reward/errors": [float(sum(r.error is not None for r in results))],
        "reward/timeouts": [float(sum(r.error == "timeout" for r in results))],
    }
    if results:
        metrics["reward/score/mean"] = [float(np.mean([r.score for r in results]))]
    by_source: dict[str, list[float]] = defaultdict(list)
    for r, ds in zip(results, data_sources):
        by_source[ds].append(r.score)
    for ds, vals in sorted(by_source.items()):
        metrics[f"reward/{ds}/score/mean"] = [float(np.mean(vals))]
    return metrics
