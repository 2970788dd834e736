"""A step's metrics computed on the driver: the workers' values reduced over ranks, validation's per-source scores."""

from __future__ import annotations

import numpy as np

from rlkit.algo.sample_metrics import metrics_by_source
from rlkit.protocol import Batch


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
