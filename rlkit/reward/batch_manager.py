"""The `batch` reward manager (verl's BatchRewardManager): the user's function scores the whole batch in one call.

    compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> [score per sample]

called by keyword with lists (one entry per sample, in batch order); `kwargs` are
`reward_model.scorer_kwargs.custom` and `reward_model.reward_kwargs` (verl passes the latter). A score is a
float or a dict with `score` (its other keys become `reward_extra/<name>` columns), as in the `rule`
manager. For functions that gain from seeing the batch at once: one request to a remote verifier, a
vectorised check, a batched model call.

Unlike `rule` there is no per-sample timeout or thread pool (the call is one); a call that raises, returns
a list of the wrong length, or a non-number for every sample stops the run with a UserError (it is a bug in
the function, not a bad sample); a bad entry among good ones scores 0 and is counted in `reward/errors`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from rlkit.errors import UserError
from rlkit.protocol import METRICS_KEY, Batch
from rlkit.reward.custom import load_custom_fn
from rlkit.reward.manager import SampleScore, normalize_score, summarize
from rlkit.reward.placement import decode_responses, on_last_token
from rlkit.reward.registry import REWARD_MANAGERS

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

logger = logging.getLogger(__name__)

#: the keyword arguments verl's batch manager passes, each a list over the batch
BATCH_ARGS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")
FORM = "compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list of scores"


def bind_batch_fn(fn: Callable[..., Any], fixed: Mapping[str, Any], label: str) -> Callable[..., Any]:
    """`fn` with `fixed` keyword arguments bound, once its signature is known to take verl's batch arguments."""
    try:
        inspect.signature(fn).bind(**dict.fromkeys(BATCH_ARGS), **fixed)
    except TypeError as exc:
        raise UserError(f"custom_reward_function {label} cannot be called as reward_model.reward_manager=batch "
                        f"calls it ({exc}); the batch manager calls {FORM}") from None
    except ValueError:  # no introspectable signature: found out at the first call
        pass

    def call(**batch_args: Any) -> Any:
        return fn(**batch_args, **fixed)

    return call


@REWARD_MANAGERS.register("batch")
class BatchRewardManager:
    """verl's `batch` reward manager: `custom_reward_function.path/name` scores the batch in one call."""

    def __init__(self, tokenizer: Any, fn: Callable[..., Any], label: str,
                 fixed: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.label = label
        self.fn = bind_batch_fn(fn, dict(fixed or {}), label)

    @classmethod
    def from_config(cls, cfg: RLConfig, tokenizer: Any, **reward_kwargs: Any) -> BatchRewardManager:
        custom = cfg.custom_reward_function
        cls.check_config(cfg)
        fixed = {**dict((cfg.reward_model.scorer_kwargs or {}).get("custom") or {}), **reward_kwargs}
        return cls(tokenizer, load_custom_fn(custom.path, custom.name), f"'{custom.name}' in {custom.path}", fixed)

    @staticmethod
    def check_config(cfg: RLConfig, **_: Any) -> None:
        if not cfg.custom_reward_function.path:
            raise UserError("reward_model.reward_manager=batch scores with your function: set "
                            f"custom_reward_function.path (and .name) to a file defining {FORM}")

    @staticmethod
    def check_custom(cfg: RLConfig, fn: Callable[..., Any], label: str) -> None:
        """Pre-flight: the function takes the batch arguments and the configured keyword arguments."""
        fixed = {**dict((cfg.reward_model.scorer_kwargs or {}).get("custom") or {}),
                 **dict(cfg.reward_model.reward_kwargs or {})}
        bind_batch_fn(fn, fixed, label)

    def has_scorer(self, data_source: str) -> bool:
        """Every row is the function's (the reward mix asks)."""
        return True

    def __call__(self, batch: Batch) -> Batch:
        return self.compute(batch)

    def compute(self, batch: Batch) -> Batch:
        """`token_level_scores` (B, R), `reward_extra/<name>` and `meta['metrics']`, as the `rule` manager's."""
        n = len(batch)
        mask = batch["response_mask"]
        reward_model = batch["reward_model"] if "reward_model" in batch else [None] * n
        data_sources = [str(d) for d in batch["data_source"]]
        extra_infos = list(batch["extra_info"]) if "extra_info" in batch else [None] * n
        args = {
            "data_sources": data_sources,
            "solution_strs": decode_responses(self.tokenizer, batch["responses"], mask),
            "ground_truths": [rm.get("ground_truth") if isinstance(rm, Mapping) else None for rm in reward_model],
            "extra_infos": extra_infos,
        }
        results = self._results(self._call(args), n) if n else []
        scores = on_last_token(torch.tensor([r.score for r in results], dtype=torch.float32), mask)
        extra_names = sorted({k for r in results for k in r.extras})
        non_tensors = {f"reward_extra/{k}": [r.extras.get(k) for r in results] for k in extra_names}
        return Batch({"token_level_scores": scores}, non_tensors, {METRICS_KEY: summarize(results, data_sources)})

    def _call(self, args: dict[str, list[Any]]) -> Any:
        try:
            out = self.fn(**args)
            return asyncio.run(_await(out)) if inspect.isawaitable(out) else out
        except Exception as exc:
            logger.exception("custom_reward_function %s raised", self.label)
            raise UserError(f"custom_reward_function {self.label} raised {type(exc).__name__}: {exc} on a batch of "
                            f"{len(args['data_sources'])} samples (traceback above); that is a bug in the function, "
                            "so the run stops") from exc

    def _results(self, out: Any, n: int) -> list[SampleScore]:
        if hasattr(out, "tolist"):  # a numpy array or tensor of scores
            out = out.tolist()
        if not isinstance(out, list | tuple) or len(out) != n:
            got = f"{len(out)} scores" if isinstance(out, list | tuple) else type(out).__name__
            raise UserError(f"custom_reward_function {self.label} returned {got} for a batch of {n} samples; "
                            f"the batch manager expects one score per sample ({FORM})")
        results = []
        for value in out:
            try:
                results.append(normalize_score(value, "custom"))
            except (TypeError, ValueError) as exc:
                results.append(SampleScore(0.0, {}, f"{type(exc).__name__}: {exc}", "custom"))
        if results and all(r.error is not None for r in results):
            raise UserError(f"custom_reward_function {self.label} returned no usable score in a batch of {n} "
                            f"(first: {results[0].error}); return a float or a dict with 'score' per sample")
        bad = [r for r in results if r.error is not None]
        if bad:
            logger.warning("custom_reward_function %s: %d of %d scores unusable (first: %s); they score 0",
                           self.label, len(bad), n, bad[0].error)
        return results


async def _await(awaitable: Any) -> Any:
    return await awaitable
