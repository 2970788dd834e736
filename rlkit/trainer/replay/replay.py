"""`rlkit debug replay RUN_OR_CKPT --step N`: run step N's update again in this process, without Ray.

The run recorded the batch step N's updates received (rlkit/trainer/replay/step_record.py). Here the role's worker
class is built as the Ray worker builds it (`local_host`: the same `_WorkerHost`, rank 0 of a single-process
group), the checkpoint before step N is loaded into it, and the recorded batches of the steps after that
checkpoint up to N go through the same registered method the driver called (`update_actor`, `update_critic`,
`compute_ref_log_prob`). Nothing runs in another process, so `breakpoint()`, pdb, print and an IDE's plain
"run this file" stop and show where they would in the run; `--break-at PHASE` pauses at a phase as
`trainer.debug.break_at` does in a run.

On CPU in float32 a replay of a one-worker run equals the run bit for bit (loss, gradient norm, weights): the
same code on the same values with the same thread count. A run with several workers split the batch over
them and summed their gradients; its replay runs the whole batch on one worker, the same update up to the
order of floating-point sums. On GPU, kernels that pick their reduction order at run time (cuBLAS split-K,
atomics) may differ in the last bits unless the run and the replay both use `trainer.deterministic=true`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlkit.errors import UserError
from rlkit.phases import role_call, training_calls
from rlkit.protocol import Batch
from rlkit.registry import Registry
from rlkit.trainer.replay.step_record import StepRecord, find_record, load_record

#: the update each trained role runs in a step (the driver's call), replayed for the steps since the checkpoint
UPDATES = training_calls()


@dataclass(frozen=True)
class RoleReplay:
    """How one role's part of step N is replayed: the worker roles built in this process, the trained role whose
    recorded updates bring it from the checkpoint to step N (None: nothing trained, no checkpoint), whether
    step N's own update is replayed, and `run(host, record, role)`, which does the role's call of step N and
    returns its metrics."""

    roles: tuple[str, ...]
    history: str | None
    updates_at_n: bool
    run: Callable[[Any, StepRecord, str], dict[str, float]]


def _update(host: Any, record: StepRecord, name: str) -> dict[str, float]:
    from rlkit.trainer.step.step_metrics import reduce_worker_metrics

    out = host.call(name, UPDATES[name], record.step, record.batch)
    return reduce_worker_metrics(out.meta.get("metrics", {}))


def _reference(host: Any, record: StepRecord, name: str) -> dict[str, float]:
    """The reference log-probs again, against the recorded ones (0.0: equal)."""
    if "ref_log_prob" not in record.batch:
        raise UserError(f"step {record.step}'s batch has no ref_log_prob: that run used no reference; replay "
                        "--role actor or critic")
    out = host.call(name, role_call("ref", "ref"), record.step, record.batch)
    mask = record.batch["response_mask"].bool()
    gap = (out["ref_log_prob"] - record.batch["ref_log_prob"]).abs()[mask]
    return {"ref/log_prob_max_abs_diff": float(gap.max()) if gap.numel() else 0.0}


def _regenerate(host: Any, record: StepRecord, name: str) -> dict[str, float]:
    """Step N's generation again, with the policy of the step before it, in the run's row order and seeds: each
    data-parallel rank's share with that rank's sampling seed. Returns how many rows' responses differ."""
    from rlkit.rollout.lifecycle import call_seed

    batch = record.batch
    world = record.world_size // record.cfg.actor_rollout_ref.rollout.tensor_model_parallel_size  # its DP ranks
    host.call(name, "sync_weights", record.step)  # the actor's weights (the checkpoint + the steps since) -> engine
    order = torch.as_tensor(record.rollout_order) if record.rollout_order is not None else torch.arange(len(batch))
    prompt_len = batch["prompts"].shape[1]
    gen = batch.index(torch.argsort(order)).select(["input_ids", "attention_mask", "position_ids"])
    gen = Batch({k: v[:, :prompt_len] for k, v in gen.tensors.items()})  # the prompts, as the engine got them
    padded, pad = gen.pad_to_divisor(world)
    worker = host._roles[name]
    outs = []
    for rank, chunk in enumerate(padded.chunk(world)):  # DP_COMPUTE's split: rank r samples with its own seed
        worker.set_dispatch_info(rank, world, True)
        outs.append(host.call(name, "generate_sequences", record.step, chunk, seed=call_seed(record.step)))
    out = Batch.concat(outs).unpad(pad).index(order)
    differ = (out["responses"] != batch["responses"]).any(-1)
    metrics = {"rollout/replayed_rows": float(len(batch)), "rollout/rows_with_other_responses": float(differ.sum())}
    if "rollout_log_probs" in out and "rollout_log_probs" in batch and not differ.any():
        gap = (out["rollout_log_probs"] - batch["rollout_log_probs"]).abs()[batch["response_mask"].bool()]
        metrics["rollout/log_prob_max_abs_diff"] = float(gap.max()) if gap.numel() else 0.0
    return metrics


REPLAY_ROLES: Registry[RoleReplay] = Registry("replay role")
REPLAY_ROLES.add("actor", RoleReplay(("actor",), "actor", True, _update))
REPLAY_ROLES.add("critic", RoleReplay(("critic",), "critic", True, _update))
REPLAY_ROLES.add("ref", RoleReplay(("ref",), None, False, _reference))
REPLAY_ROLES.add("rollout", RoleReplay(("actor", "rollout"), "actor", False, _regenerate))


@dataclass
class ReplayResult:
    step: int
    role: str
    metrics: dict[str, float]  # what the replayed call returned, reduced as the run's row is
    logged: dict[str, float]  # the run's metrics.jsonl row of the step ({} when it has none)
    checkpoint: Path | None  # where it started (None: the initial weights)
    steps: list[int] = field(default_factory=list)  # the steps whose updates were replayed
    host: Any = None  # the in-process worker host (its roles hold the replayed models)

    def compared(self) -> list[tuple[str, float, float | None]]:
        """(metric, replayed, logged) for every replayed metric but timings and the LR."""
        return [(k, v, self.logged.get(k)) for k, v in sorted(self.metrics.items())
                if not k.startswith(("timing_s/", "memory/", "perf/")) and not k.endswith("/lr")]


def replay_step(target: str | Path, step: int, role: str = "actor", break_at: str | None = None,
                say: Callable[[str], None] = print) -> ReplayResult:
    """Replay `role`'s part of step `step` of the run at `target` (its checkpoint root, a checkpoint in it, its
    default log dir, or a record file): build the role in this process, load the checkpoint before the step,
    replay the recorded updates since, then the step's own call."""
    from rlkit.controller.worker_group import local_host
    from rlkit.utils.checkpoint_io import load_rng_state, step_of

    spec = REPLAY_ROLES.get(role)
    target = Path(target).expanduser()
    record = load_record(find_record(target, step))
    cfg = record.cfg
    _check_replayable(cfg, role)
    roles = tuple(_host_role(cfg, r) for r in spec.roles)
    checkpoint = _checkpoint_before(target, record) if spec.history else None
    start = 0 if checkpoint is None else _step_of(checkpoint)
    if spec.history and step_of(target) is None:  # the run's root: its own checkpoint before the step
        _check_base_kept(record, start)
    history = [_record_of(record, s, checkpoint) for s in range(start + 1, step)] if spec.history else []
    if spec.history == "actor":  # the actor does not update in the critic's warm-up steps
        history = [r for r in history if r.step > cfg.trainer.critic_warmup]
        if spec.updates_at_n and step <= cfg.trainer.critic_warmup:
            raise UserError(f"the actor does not update at step {step} (trainer.critic_warmup="
                            f"{cfg.trainer.critic_warmup}); replay --role critic")
    _prepare_process(cfg, break_at)
    host = local_host({name: _role_spec(cfg, record, name) for name in roles})
    replayed = [r.step for r in history] + ([step] if spec.updates_at_n else [])
    say(f"replaying step {step} ({role}) in this process (pid {os.getpid()}) from "
        f"{checkpoint or 'the initial weights'}" + (f"; updates of steps {replayed}" if replayed else ""))
    for name in roles:
        host.call(name, "init_model", None)
    if checkpoint is not None:
        host.call(spec.history, "load_checkpoint", None, str(checkpoint / spec.history))
    for rec in history:
        if rec.worker_rng:
            load_rng_state(rec.worker_rng[0])
        _update(host, rec, spec.history)
    if record.worker_rng:
        load_rng_state(record.worker_rng[0])
    metrics = spec.run(host, record, roles[-1])
    return ReplayResult(step, role, metrics, _logged_row(record), checkpoint, replayed, host)


def _check_replayable(cfg: Any, role: str) -> None:
    """Refuse, in one line, a role this run has not, or a rollout the replay cannot make again."""
    from rlkit.trainer.run.run_plan import RunPlan

    plan = RunPlan.of(cfg)
    if role == "critic" and not plan.critic:
        raise UserError("this run has no critic; replay --role actor")
    if role == "ref" and not plan.ref:
        raise UserError("this run has no reference policy; replay --role actor")
    if role != "rollout":
        return
    rollout = cfg.actor_rollout_ref.rollout
    why = ("the batch was generated during the step before, by a separate rollout group (one-step-off / fully "
           "async)" if cfg.trainer.separate_rollout else
           "the batch is a selection from several generations (algorithm.filter_groups)"
           if cfg.algorithm.filter_groups.enable else
           "the agent loop's turns are not recorded" if rollout.multi_turn.enable else
           "its sampling was not seeded (rollout.seed=null)" if rollout.seed is None else "")
    if why:
        raise UserError(f"--role rollout cannot regenerate this run's batch: {why}; replay --role actor")


def _host_role(cfg: Any, role: str) -> str:
    """The worker role that does `role`'s work: a LoRA actor is its own reference."""
    from rlkit.models.lora import lora_enabled

    return "actor" if role == "ref" and lora_enabled(cfg.actor_rollout_ref.model) else role


def _role_spec(cfg: Any, record: StepRecord, name: str) -> Any:
    """The role as the run built it (a colocated engine loads the actor built before it)."""
    from rlkit.trainer.run.roles import role_spec

    return role_spec(cfg, name, record.model_path, record.total_steps)


def _prepare_process(cfg: Any, break_at: str | None) -> None:
    """This process as the run's worker was: its torch threads (CPU), determinism, the phase to pause at."""
    from rlkit.debug.breakpoints import BREAK_AT_ENV, break_at_list
    from rlkit.utils.determinism import deterministic_env

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, int(cfg.trainer.cpus_per_worker)))  # a Ray worker runs that many
    os.environ.update(deterministic_env(cfg.trainer.deterministic))
    if break_at:
        os.environ[BREAK_AT_ENV] = ",".join(break_at_list(break_at))


def _step_of(path: Path) -> int:
    from rlkit.utils.checkpoint_io import step_of

    step = step_of(path)
    assert step is not None
    return step


def _checkpoint_before(target: Path, record: StepRecord) -> Path | None:
    """The checkpoint to start from: `target` itself when it is a checkpoint before the step, else the run's
    newest complete one before it; None when the run had none (the replay starts from the initial weights)."""
    from rlkit.utils.checkpoint_io import list_checkpoints, open_checkpoint, step_of

    named = step_of(target)
    if named is not None:
        if named >= record.step:
            raise UserError(f"{target} is the checkpoint after step {named}; step {record.step} replays from a "
                            "checkpoint before it (pass the run's checkpoint root)")
        return open_checkpoint(target, "rlkit debug replay")
    before = [p for s, p in list_checkpoints(record.checkpoint_root) if s < record.step]
    return before[-1] if before else None


def _check_base_kept(record: StepRecord, start: int) -> None:
    """The checkpoint step N's replay starts from (the run's last save before N) is there; a run whose rotation
    removed it (recorded before rlkit kept it, rlkit.utils.checkpoint_io.replay_bases) says so in one line."""
    t = record.cfg.trainer
    expected = (record.step - 1) // t.save_freq * t.save_freq if t.save_freq > 0 else 0
    if expected > start and t.max_actor_ckpt_to_keep is not None:
        raise UserError(f"step {record.step} replays from the checkpoint of step {expected}, which this run's "
                        f"rotation removed (trainer.max_actor_ckpt_to_keep={t.max_actor_ckpt_to_keep}); this rlkit "
                        f"keeps a recorded step's checkpoint: record it again with trainer.debug.record_steps="
                        f"[{record.step}]")


def _record_of(record: StepRecord, step: int, checkpoint: Path | None) -> StepRecord:
    """The record of an earlier step of the same run (replayed on the way from the checkpoint to step N)."""
    from rlkit.trainer.replay.step_record import record_path, recorded_steps

    path = record_path(record.checkpoint_root, step)
    if not path.is_file():
        have = ", ".join(map(str, recorded_steps(path.parent))) or "none"
        raise UserError(f"step {record.step} replays from {checkpoint or 'the initial weights'} through the steps "
                        f"since, and step {step} has no record (this run recorded steps {have}); this rlkit records "
                        f"them with step {record.step}: record it again with trainer.debug.record_steps="
                        f"[{record.step}]")
    return load_record(path)


def _logged_row(record: StepRecord) -> dict[str, float]:
    path = Path(record.log_dir) / "metrics.jsonl"
    if not path.is_file():
        return {}
    for line in reversed(path.read_text().splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("step") == record.step and any(k.startswith(("actor/", "critic/")) for k in row):
            return row
    return {}
