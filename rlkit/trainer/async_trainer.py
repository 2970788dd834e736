"""One-step-off-policy mode (`trainer.one_step_off_policy=true`): generate batch k+1 while training on batch k.

The rollout engine lives in its own worker group (its own processes and cores) instead of
sharing the actor's process. Each step:

    batch_k   <- the generation launched during step k-1 (waits only if it is not done yet)
    launch generation of batch k+1 on the rollout group      (runs while the actor trains)
    old/ref log-probs, advantages, update_actor on batch k    (the unchanged `train_step`)
    weights -> rollout group                                  (queued behind generation k+1)

so batch k+1 is sampled by the weights from before update k: one step behind the policy that
trains on it. The correction is truncated importance sampling with the engine's own log-probs
(`rollout_log_probs`): the policy loss weighs each token by min(pi_old / pi_rollout,
`algorithm.rollout_is_threshold`); `finalize` turns both switches on for this mode
(rlkit.config.finalize.apply_modes), so --dry-run shows them. Step 1 has
nothing to overlap with and runs synchronously.

The layout (actor group + rollout group) is `build_workers`'s separate-rollout layout
(rlkit/trainer/workers_setup.py); weights travel as one full state dict through Ray's object
store (rank 0 of the actor gathers it; the rollout workers read the same object), not through
the driver (`ObjectStoreRoute`, rlkit/rollout/lifecycle.py).

Limits: dynamic sampling (algorithm.filter_groups) is not supported here; a checkpoint taken in
this mode resumes without the batch that was in flight (one batch of prompts is skipped).
"""

from __future__ import annotations

from typing import Any

from rlkit.config.schema import RLConfig
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.rollout.lifecycle import call_seed
from rlkit.trainer.ppo_trainer import PROMPT_KEYS, RLTrainer
from rlkit.trainer.rollout_flow import Timer, repeat_with_uids
from rlkit.trainer.workers_setup import WorkerHandles


class OneStepOffPolicyTrainer(RLTrainer):
    """`RLTrainer` whose rollout runs one batch ahead on a separate worker group (see the module docstring)."""

    def __init__(self, cfg: RLConfig, workers: WorkerHandles | None = None, tracker: Any = None) -> None:
        if not (cfg.actor_rollout_ref.rollout.calculate_log_probs and cfg.algorithm.rollout_is):
            raise UserError("trainer.one_step_off_policy: this config was not finalized (rollout log-probs and "
                            "algorithm.rollout_is are off); build it with rlkit.trainer.run_config.load_config")
        self._pending: tuple[Any, Batch, int, Any, Batch] | None = None
        self._lookahead: list[Batch] = []
        super().__init__(cfg, workers=workers, tracker=tracker)

    # ----------------------------------------------------------- data
    def _batches(self):
        """The loader's batches, with the one `_peek` took ahead served first."""
        self._source = super()._batches()
        while True:
            yield self._lookahead.pop(0) if self._lookahead else next(self._source)

    def _peek(self) -> Batch:
        """The prompts of the next step, fetched now; `fit` receives the same batch next step."""
        if not self._lookahead:
            self._lookahead.append(next(self._source))
        return self._lookahead[0]

    def busy_groups(self) -> tuple[Any, ...]:
        """The rollout group while the next batch is being generated (its memory is popped once idle)."""
        return (self.workers.rollout.group,) if self._pending is not None else ()

    # ----------------------------------------------------------- rollout
    def _launch(self, prompts: Batch, stale: int) -> tuple[Any, Batch, int, Any, Batch]:
        """Generate the batch of step `global_step + stale` (its step and seed: break_at and resume see
        the step the batch is trained at, not the one it was launched in)."""
        gen = repeat_with_uids(prompts, self.cfg.actor_rollout_ref.rollout.n)
        keys = self._rollout_keys(gen) if hasattr(self, "_rollout_keys") else PROMPT_KEYS
        step = self.global_step + stale
        seed = call_seed(step)
        future = self.workers.rollout.generate_sequences(gen.select(keys), step=step, seed=seed, blocking=False)
        # queued behind the samples on the same workers, so generated with the same weights (None unless needed)
        baseline = self._launch_baseline(prompts, step, seed, blocking=False)
        return future, gen, stale, baseline, prompts

    def _rollout(self, prompts: Batch, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Batch k from the generation launched last step; launch k+1 before training on k."""
        if self._pending is None:  # first step (or after a resume): nothing in flight, generate now
            self._pending = self._launch(prompts, stale=0)
        future, gen, stale, baseline, prompts = self._pending
        self._pending = None
        with timer("gen_wait"):
            out = future.get()
        wait_s = timer.seconds["gen_wait"]
        gen_s = out.meta.get("metrics", {}).get("timing_s/generate_sequences", 0.0)  # the engine's own time
        gen_s = max(gen_s) if isinstance(gen_s, list) else float(gen_s)
        out.non_tensors.update(gen.non_tensors)
        if self.global_step < self.total_steps:
            self._pending = self._launch(self._peek(), stale=1)
        with timer("reward"):
            out.union(self.reward_fn(out))
        if baseline is not None:
            with timer("gen_baseline"):
                n = self.cfg.actor_rollout_ref.rollout.n
                out["reward_baselines"] = self._baseline_rewards(baseline.get(), prompts, n)
        metrics = {"timing_s/gen_overlapped": max(0.0, gen_s - wait_s), "rollout/staleness": float(stale)}
        metrics.update(self.workers.weights.collect())  # the load queued after last step's update
        return out, metrics


def build_trainer(cfg: RLConfig, **kwargs: Any) -> RLTrainer:
    """The trainer a config asks for: synchronous (hybrid engine), one-step-off-policy or fully async
    (rlkit/trainer/fully_async_trainer.py; finalize has refused both async switches at once)."""
    from rlkit.trainer.fully_async_trainer import FullyAsyncTrainer

    t = cfg.trainer
    cls = FullyAsyncTrainer if t.fully_async else OneStepOffPolicyTrainer if t.one_step_off_policy else RLTrainer
    return cls(cfg, **kwargs)
