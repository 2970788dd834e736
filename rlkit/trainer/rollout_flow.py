"""Driver-side pieces of a step that are not worker calls: uids, rewards -> advantages, metrics.

Kept apart from the fit loop so the loop reads as the algorithm and these stay
unit-testable without Ray.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from rlkit.algo import ADV_ESTIMATORS, AdvantageInputs
from rlkit.algo.dapo import overlong_reward_shaping
from rlkit.algo.kl import apply_kl_penalty
from rlkit.algo.sample_metrics import metrics_by_source
from rlkit.config.schema import RLConfig
from rlkit.protocol import Batch
from rlkit.reward.placement import on_last_token


class Timer:
    """`with timer("gen"):` accumulates the driver's seconds in phase `gen` (logged as `timing_s/gen`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


def repeat_with_uids(prompts: Batch, n: int) -> Batch:
    """Give each prompt a uid, then repeat it n times (interleaved) so the samples of a group are adjacent."""
    prompts["uid"] = np.array([uuid.uuid4().hex for _ in range(len(prompts))], dtype=object)
    return prompts.repeat(n, interleave=True)


def shape_rewards(batch: Batch, cfg: RLConfig, kl_ctrl) -> dict[str, float]:
    """token_level_scores -> token_level_rewards: optional overlong penalty and in-reward KL."""
    metrics: dict[str, float] = {}
    scores = batch["token_level_scores"].clone()
    overlong = cfg.reward_model.overlong_buffer
    if overlong.get("enable"):
        lengths = batch["response_mask"].sum(-1)
        penalty = overlong_reward_shaping(
            lengths, cfg.data.max_response_length, int(overlong["len"]), float(overlong["penalty_factor"])
        )
        scores += on_last_token(penalty, batch["response_mask"])
        metrics["reward/overlong_penalty/mean"] = float(penalty.mean())
    if cfg.algorithm.use_kl_in_reward:
        rewards, kl_metrics = apply_kl_penalty(
            scores, batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"].float(),
            kl_ctrl, cfg.algorithm.kl_penalty,
        )
        metrics.update(kl_metrics)
    else:
        rewards = scores
    batch["token_level_rewards"] = rewards
    return metrics


def compute_advantages(batch: Batch, cfg: RLConfig) -> None:
    """Look the estimator up by name and write `advantages` and `returns` into the batch."""
    algo = cfg.algorithm
    estimator = ADV_ESTIMATORS.get(algo.adv_estimator)
    advantages, returns = estimator(AdvantageInputs(
        batch["token_level_rewards"],
        batch["response_mask"].float(),
        index=batch["uid"] if "uid" in batch else None,
        values=batch["values"] if "values" in batch else None,
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std=algo.norm_adv_by_std_in_grpo,
        reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
    ))
    batch["advantages"] = advantages.float()
    batch["returns"] = returns.float()


def reduce_worker_metrics(metrics: dict) -> dict[str, float]:
    """Workers' lists of per-rank/per-micro-batch values -> their mean (timings: the max, the slowest rank sets
    the pace)."""
    out = {}
    for k, v in metrics.items():
        vals = v if isinstance(v, list) else [v]
        vals = [float(x) for x in vals if x is not None]
        if not vals:
            continue
        out[k] = max(vals) if k.startswith("timing_s/") else float(np.mean(vals))
    return out


def validation_metrics(batch: Batch, n: int) -> dict[str, float]:
    """`val/<data_source>/...`: mean@n, best@n, pass@n, maj@n of the scored samples, as `rlkit eval`
    computes them (rlkit.algo.sample_metrics); correctness is the scorer's `acc` extra when it has one."""
    per_source = metrics_by_source(
        [str(d) for d in batch["data_source"]], list(batch["uid"]), batch["token_level_scores"].sum(-1).tolist(), n,
        acc=batch["reward_extra/acc"] if "reward_extra/acc" in batch else None,
        preds=batch["reward_extra/pred"] if "reward_extra/pred" in batch else None,
        lengths=batch["response_mask"].sum(-1).tolist(),
    )
    return {f"val/{ds}/{name}": value for ds, metrics in per_source.items() for name, value in metrics.items()}
