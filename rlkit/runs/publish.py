"""What a driver publishes about its run, started by the fit loop (`TrainerBase.fit`): the status file and, when
`trainer.prometheus.port` is set, the Prometheus endpoint. Reads the trainer duck-typed (RL, SFT, DPO alike)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from rlkit.runs.status import RunStatus, worker_rows

log = logging.getLogger("rlkit.runs")


def trainer_kind(trainer: Any) -> str:
    """grpo / gae / rloo... for an RL run (its advantage estimator), else the trainer class's name (sft, dpo)."""
    estimator = getattr(getattr(trainer.cfg, "algorithm", None), "adv_estimator", None)
    if estimator:
        return str(estimator)
    return type(trainer).__name__.removesuffix("Trainer").lower() or "trainer"


def precision_of(cfg: Any) -> str:
    """The actor's compute dtype as configured (`auto` resolved the way the workers resolve it)."""
    arr = getattr(cfg, "actor_rollout_ref", None)
    fsdp = getattr(arr.actor, "fsdp_config", None) if arr is not None else getattr(cfg, "engine", None)  # RL / SFT
    dtype = str(getattr(fsdp, "param_dtype", "auto") or "auto")
    try:
        from rlkit.utils.cpu_precision import resolved_param_dtype

        t = cfg.trainer
        return resolved_param_dtype(dtype, t.device, max(1, int(t.cpus_per_worker)))
    except Exception:  # a label: never a reason to fail a run
        return dtype


SAMPLE_DIRS = ("rollout_data_dir", "validation_data_dir")  # where `rlkit show` / `top` find the latest samples


def _abs(path: Any) -> str | None:
    return str(Path(path).expanduser().resolve()) if path else None


def _ray_address() -> str | None:
    """The run's Ray (GCS) address, for `rlkit top`'s look at Ray's state API; None without Ray."""
    ray = sys.modules.get("ray")
    try:
        return ray.get_runtime_context().gcs_address if ray is not None and ray.is_initialized() else None
    except Exception:
        return None


def begin_run_status(trainer: Any) -> RunStatus:
    """The status file of `trainer`'s run (in its checkpoint root), written once now; the endpoint if asked."""
    tracker_run = getattr(trainer.tracker, "run", None)
    log_dir = getattr(tracker_run, "log_dir", None)
    status = RunStatus(
        trainer.ckpt_root, trainer=trainer_kind(trainer), total=trainer.total_steps, step=trainer.global_step,
        log_dir=str(Path(log_dir).resolve()) if log_dir else None, precision=precision_of(trainer.cfg),
        argv=sys.argv, workers=lambda: worker_rows(getattr(trainer, "workers", None)),
        **{key: _abs(getattr(trainer.cfg.trainer, key, None)) for key in SAMPLE_DIRS}, ray_address=_ray_address(),
    )
    endpoint = getattr(trainer.cfg.trainer, "prometheus", None)
    if endpoint is not None and endpoint.port is not None:
        from rlkit.runs.prometheus import MetricsEndpoint

        server = MetricsEndpoint.from_config(endpoint).start()
        status.listeners.append(server.set_status)
        status.row_listeners.append(server.set_row)
        status.closers.append(server.stop)
        status.data["prometheus"] = server.url
        log.warning("Prometheus metrics of this run at %s", server.url)
    return status.begin()
