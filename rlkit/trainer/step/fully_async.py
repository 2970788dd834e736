"""Fully asynchronous rollout (`trainer.fully_async=true`): the rollout streams, the trainer consumes full batches.

Same separate-rollout layout as one-step-off (rlkit/trainer/step/one_step_off.py): the engines have a
worker group of their own and weights reach them through Ray's object store. Instead of one
batch ahead, a driver thread (`RolloutPump`, rlkit/trainer/step/rollout_pump.py) keeps small
generation requests in flight all the time and puts finished chunks into a buffer; each step
takes `train_batch_size x rollout.n` samples from it (oldest policy version first, GRPO groups
whole), trains on them with the unchanged RL step, and pushes the new weights, which the
engines pick up between requests.

    staleness of a sample = (policy version being updated) - (version its first token was sampled with)
                          <= trainer.staleness_threshold      (admission + drop, sample_buffer.py)

With `trainer.partial_rollout_segment` > 0 responses are generated in segments and an unfinished
one continues under whatever weights arrived in between (partial_rollout.py); each token keeps
the version that drew it (`token_policy_version`) and its engine log-prob, so the token-level
rollout correction (`algorithm.rollout_is`, turned on by finalize, old log-probs recomputed by
the trainer's current policy as in every mode) corrects each token against its own sampler.

Per step: `policy_version` (B,) and `token_policy_version` (B, R) in the batch; metrics
`rollout/staleness/mean|max`, `rollout/dropped_stale` (this step) and `rollout/dropped_stale_total`,
`rollout/mixed_version_samples` (fraction of samples whose tokens span more than one version).

Limits: dynamic sampling and greedy-baseline estimators (ReMax) are not supported; the pump reads
the training prompts ahead of the trainer, so a checkpoint resumes without the prompts that were in
flight or buffered (at most `(staleness_threshold + 1)` batches are skipped).
"""

from __future__ import annotations

from typing import Any

import torch

from rlkit.models.model_info import special_token_ids
from rlkit.protocol import Batch
from rlkit.trainer.step.partial_rollout import PartialChunk
from rlkit.trainer.step.rollout_pump import RolloutPump, VersionClock, VersionedRoute
from rlkit.trainer.step.rollout_source import RolloutContext, RolloutSource, repeat_with_uids
from rlkit.trainer.step.sample_buffer import SampleBuffer, StalenessBudget
from rlkit.trainer.step.step_result import Timer


class FullyAsyncRollout(RolloutSource):
    """Full batches from a rollout pump with bounded staleness (see the module docstring)."""

    def __init__(self, ctx: RolloutContext) -> None:
        """The config is finalized (rlkit.trainer.run.run_config.load_config): rollout log-probs and the correction
        are on, and no estimator needs a greedy baseline (refused there)."""
        super().__init__(ctx)
        self.clock = VersionClock()
        route = ctx.workers.weights
        ctx.workers.weights = VersionedRoute(route, self.clock)
        self.stop_ids, self.pad_id = special_token_ids(ctx.model_path, ctx.tokenizer)
        self.pump: RolloutPump | None = None

    def busy_groups(self) -> tuple[Any, ...]:
        """The rollout group is generating between steps (its memory peaks are not popped)."""
        return (self.ctx.workers.rollout.group,) if self.pump is not None else ()

    def close(self) -> None:
        if self.pump is not None:
            self.pump.stop()

    def _prompt_chunks(self):
        """The training prompts cut into chunks of `rollout_chunk_prompts` prompts, each repeated n times."""
        c, n = self.ctx.cfg.trainer.rollout_chunk_prompts, self.ctx.cfg.actor_rollout_ref.rollout.n
        for prompts in self.ctx.prompts:
            for start in range(0, len(prompts), c):
                yield repeat_with_uids(prompts[start : start + c], n)

    def _new_chunk(self, gen: Batch) -> PartialChunk:
        keys = [k for k in self.ctx.rollout_keys(gen) if k not in gen.tensors]
        return PartialChunk(
            gen, self.ctx.cfg.actor_rollout_ref.rollout.response_length, self.pad_id, self.stop_ids,
            request_keys=keys,
        )

    def _start_pump(self) -> None:
        t, n = self.ctx.cfg.trainer, self.ctx.cfg.actor_rollout_ref.rollout.n
        batch = self.ctx.cfg.data.train_batch_size * n
        step = self.ctx.step()
        self.clock.value = step - 1  # the policy after step - 1 updates (resumed or not)
        budget = StalenessBudget(batch, t.staleness_threshold, total=batch * self.ctx.total_steps,
                                 started=batch * (step - 1))
        self.pump = RolloutPump(
            self.ctx.workers.rollout,
            self._prompt_chunks(),
            self._new_chunk,
            self.clock,
            budget,
            SampleBuffer(t.staleness_threshold),
            t.partial_rollout_segment,
        )
        self.pump.start()

    def next_batch(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The next full batch from the pump's buffer, scored; staleness metrics."""
        if self.pump is None:
            self._start_pump()
        assert self.pump is not None
        trained = self.ctx.step() - 1
        batch_size = self.ctx.cfg.data.train_batch_size * self.ctx.cfg.actor_rollout_ref.rollout.n
        with timer("gen_wait"):
            chunks, dropped = self.pump.take(batch_size, trained)
        out = Batch.concat(chunks)
        with timer("reward"):
            out.union(self.ctx.reward_fn(out))
        metrics = staleness_metrics(out, trained)
        metrics["rollout/dropped_stale"] = float(dropped)
        metrics["rollout/dropped_stale_total"] = float(self.pump.dropped_total)
        metrics.update(self.ctx.workers.weights.collect_if_done())  # the last load, if it has run by now
        return out, metrics


def staleness_metrics(batch: Batch, trained_version: int) -> dict[str, float]:
    """`rollout/staleness/mean|max` over the batch's samples and the share of samples drawn by several versions."""
    lag = (trained_version - batch["policy_version"]).float()
    versions = batch["token_policy_version"]
    valid = versions >= 0
    newest = torch.where(valid, versions, -1).max(dim=1).values
    mixed = (newest > batch["policy_version"]).float()
    return {
        "rollout/staleness/mean": float(lag.mean()),
        "rollout/staleness/max": float(lag.max()),
        "rollout/mixed_version_samples": float(mixed.mean()),
    }
