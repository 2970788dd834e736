"""One-step-off-policy rollout (`trainer.one_step_off_policy=true`): generate batch k+1 while training on batch k.

The rollout engine lives in its own worker group (its own processes and cores) instead of
sharing the actor's process. Each step:

    batch_k   <- the generation launched during step k-1 (waits only if it is not done yet)
    launch generation of batch k+1 on the rollout group      (runs while the actor trains)
    old/ref log-probs, advantages, update_actor on batch k    (the unchanged RL step)
    weights -> rollout group                                  (queued behind generation k+1)

so batch k+1 is sampled by the weights from before update k: one step behind the policy that
trains on it. The correction is truncated importance sampling with the engine's own log-probs
(`rollout_log_probs`): the policy loss weighs each token by min(pi_old / pi_rollout,
`algorithm.rollout_is_threshold`); `finalize` turns both switches on for this mode
(rlkit.config.finalize.apply_modes), so --dry-run shows them. Step 1 has
nothing to overlap with and runs synchronously.

The layout (actor group + rollout group, the engines on nodes of their own with rollout.nnodes) is the run
plan's separate-rollout layout (rlkit/trainer/run/run_plan.py); weights travel by a broadcast from the actor's
rank 0 to every engine in buckets (`BroadcastRoute`, rlkit/workers/weight_broadcast.py), or with
rollout.weight_transfer=object_store as one full state dict through Ray's object store (`ObjectStoreRoute`),
never through the driver.

Limits: dynamic sampling (algorithm.filter_groups) is not supported here; a checkpoint taken in
this mode resumes without the batch that was in flight (one batch of prompts is skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.protocol import Batch
from rlkit.rollout.lifecycle import call_seed
from rlkit.trainer.step.rollout_source import RolloutContext, RolloutSource, repeat_with_uids
from rlkit.trainer.step.step_result import Timer


@dataclass
class _InFlight:
    future: Any  # the samples' generation
    gen: Batch  # its repeated prompts (uids, non-tensors)
    stale: int  # 0: launched in the step that trains on it, 1: one step before
    baseline: Any  # the greedy baseline's generation, or None
    prompts: Batch  # the un-repeated prompts


class OneStepOffRollout(RolloutSource):
    """The batch launched one step earlier on the separate rollout group (see the module docstring)."""

    def __init__(self, ctx: RolloutContext) -> None:
        """The config is finalized (rlkit.trainer.run.run_config.load_config): rollout log-probs and the correction
        are on for this mode."""
        super().__init__(ctx)
        self._pending: _InFlight | None = None

    def busy_groups(self) -> tuple[Any, ...]:
        """The rollout group while the next batch is being generated (its memory is popped once idle)."""
        return (self.ctx.workers.rollout.group,) if self._pending is not None else ()

    def _launch(self, prompts: Batch, stale: int) -> _InFlight:
        """Generate the batch of step `step + stale` (its step and seed: break_at and resume see the step the
        batch is trained at, not the one it was launched in)."""
        ctx = self.ctx
        gen = repeat_with_uids(prompts, ctx.cfg.actor_rollout_ref.rollout.n)
        step = ctx.step() + stale
        seed = call_seed(step)
        future = ctx.workers.rollout.generate_sequences(gen.select(ctx.rollout_keys(gen)), step=step, seed=seed,
                                                        blocking=False)
        # queued behind the samples on the same workers, so generated with the same weights (None unless needed)
        baseline = self.baseline.launch(prompts, step, seed, blocking=False)
        return _InFlight(future, gen, stale, baseline, prompts)

    def next_batch(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Batch k from the generation launched last step; launch k+1 before training on k."""
        ctx = self.ctx
        if self._pending is None:  # first step (or after a resume): nothing in flight, generate now
            self._pending = self._launch(next(ctx.prompts), stale=0)
        job, self._pending = self._pending, None
        with timer("gen_wait"):
            out = job.future.get()
        wait_s = timer.seconds["gen_wait"]
        gen_s = out.meta.get("metrics", {}).get("timing_s/generate_sequences", 0.0)  # the engine's own time
        gen_s = max(gen_s) if isinstance(gen_s, list) else float(gen_s)
        out.non_tensors.update(job.gen.non_tensors)
        if ctx.step() < ctx.total_steps:
            self._pending = self._launch(next(ctx.prompts), stale=1)
        with timer("reward"):
            out.union(ctx.reward_fn(out))
        if job.baseline is not None:
            with timer("gen_baseline"):
                n = ctx.cfg.actor_rollout_ref.rollout.n
                out["reward_baselines"] = self.baseline.rewards(job.baseline.get(), job.prompts, n)
        metrics = {"timing_s/gen_overlapped": max(0.0, gen_s - wait_s), "rollout/staleness": float(job.stale)}
        metrics.update(ctx.workers.weights.collect())  # the load queued after last step's update
        return out, metrics
