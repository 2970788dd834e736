"""Where the RL step's batch comes from: a rollout source the loop asks for the next scored batch.

The RL step (rlkit/trainer/step/rl_trainer.py) does not know how its samples were made. It calls
`source.next_batch(timer)` and gets `train_batch_size x rollout.n` generated, rewarded rows (and the
metrics of making them). The sources (`ROLLOUT_SOURCES` in rl_trainer.py), picked by `source_name(cfg)`:

* `sync` (this module): generate now with the current weights on the colocated engine; dynamic sampling
  (DAPO's `algorithm.filter_groups`) and the greedy baseline (ReMax) are parts of it;
* `one_step_off` (rlkit/trainer/step/one_step_off.py): the batch launched during the previous step, while the
  next one is launched on a separate rollout group;
* `fully_async` (rlkit/trainer/step/fully_async.py): full batches taken from a rollout pump that streams with
  bounded staleness.

A source draws its prompts from the run's `PromptStream` (the training loader, endlessly, with a look-ahead)
and reads the run through a `RolloutContext`; `busy_groups()` names the worker groups that still have a call
in flight between steps, and `close()` stops whatever the source started.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlkit.algo.dapo import dynamic_sampling_filter
from rlkit.algo.needs import Needs
from rlkit.config.schema import RLConfig
from rlkit.data.images import ENGINE_INPUTS, MODEL_INPUTS
from rlkit.data.prompt_stream import PromptStream
from rlkit.protocol import Batch
from rlkit.rollout.lifecycle import call_seed
from rlkit.trainer.run.run_plan import RunPlan
from rlkit.trainer.step.step_result import Timer

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]
IMAGE_INPUTS = (MODEL_INPUTS, ENGINE_INPUTS)  # a rollout engine generates from the images as the trainer sees them


def repeat_with_uids(prompts: Batch, n: int) -> Batch:
    """Give each prompt a uid, then repeat it n times (interleaved) so the samples of a group are adjacent."""
    prompts["uid"] = np.array([uuid.uuid4().hex for _ in range(len(prompts))], dtype=object)
    return prompts.repeat(n, interleave=True)


@dataclass
class RolloutContext:
    """What a source reads of the run."""

    cfg: RLConfig
    workers: Any  # WorkerHandles
    reward_fn: Callable[[Batch], Batch]
    prompts: PromptStream
    step: Callable[[], int]  # the trainer's global step (the one being made)
    total_steps: int
    model_path: str
    tokenizer: Any
    plan: RunPlan | None = None  # the run's (computed from cfg when None)

    def needs(self) -> Needs:
        return (self.plan or RunPlan.of(self.cfg)).needs

    def rollout_keys(self, gen: Batch) -> list[str]:
        """Prompt tensors and, for a vision-language batch, the rows' images (the HF engine reads the processor's
        tensors, vLLM the pictures); with multi-turn also the raw messages and tool/interaction kwargs the agent
        loop reads."""
        keys = PROMPT_KEYS + [k for k in IMAGE_INPUTS if k in gen.non_tensors]
        if not self.cfg.actor_rollout_ref.rollout.multi_turn.enable:
            return keys
        from rlkit.rollout.agent_rollout import agent_input_keys

        return keys + [k for k in agent_input_keys(gen) if k not in keys]


class GreedyBaseline:
    """Greedy responses to the un-repeated prompts, scored, when an estimator declares
    `@needs(greedy_baseline=True)` (ReMax); only their rewards are kept (`reward_baselines`), not trained on."""

    def __init__(self, ctx: RolloutContext) -> None:
        self.ctx = ctx
        self.enabled = ctx.needs().greedy_baseline

    def launch(self, prompts: Batch, step: int, seed: int, blocking: bool = True) -> Any:
        """The greedy generation (a Batch, or a future when not blocking); None when no estimator needs it."""
        if not self.enabled:
            return None
        keys = self.ctx.rollout_keys(prompts)
        return self.ctx.workers.rollout.generate_sequences(prompts.select(keys), step=step, seed=seed, greedy=True,
                                                           blocking=blocking)

    def rewards(self, greedy: Batch, prompts: Batch, n: int) -> torch.Tensor:
        """Score the greedy responses with the same reward stage; one value per sample row ((B*n,))."""
        greedy.non_tensors.update(prompts.non_tensors)
        return self.ctx.reward_fn(greedy)["token_level_scores"].sum(-1).float().repeat_interleave(n)


class RolloutSource:
    """The next scored batch of a step; see the module docstring."""

    def __init__(self, ctx: RolloutContext) -> None:
        self.ctx = ctx
        self.baseline = GreedyBaseline(ctx)

    def next_batch(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        raise NotImplementedError

    def busy_groups(self) -> tuple[Any, ...]:
        """Worker groups with a call in flight between steps (their memory peaks are popped later)."""
        return ()

    def close(self) -> None:
        """Stop what the source started (called once when the run ends)."""


def source_name(cfg: RLConfig) -> str:
    """The source a config asks for (`finalize` has refused both async switches at once)."""
    t = cfg.trainer
    return "fully_async" if t.fully_async else "one_step_off" if t.one_step_off_policy else "sync"


class SyncRollout(RolloutSource):
    """Generate n samples per prompt now and score them; with dynamic sampling, refill until the batch is full."""

    def next_batch(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        cfg, n = self.ctx.cfg, self.ctx.cfg.actor_rollout_ref.rollout.n
        filt = cfg.algorithm.filter_groups
        if not filt.enable:
            return self.generate(next(self.ctx.prompts), attempt=0, timer=timer), {}
        kept: list[Batch] = []
        metrics: dict[str, float] = {}
        target = cfg.data.train_batch_size * n  # each generation batch has data.gen_batch_size prompts
        for attempt in range(max(1, filt.max_num_gen_batches)):
            out = self.generate(next(self.ctx.prompts), attempt, timer)
            result = dynamic_sampling_filter(out["token_level_scores"].sum(-1).numpy(), out["uid"])
            metrics["dapo/kept_groups"] = metrics.get("dapo/kept_groups", 0) + result.kept_groups
            metrics["dapo/gen_batches"] = attempt + 1
            kept.append(out.index(result.keep_indices))
            if sum(len(k) for k in kept) >= target:
                break
        return self._trim(Batch.concat(kept), n, target), metrics

    def generate(self, prompts: Batch, attempt: int, timer: Timer) -> Batch:
        """One generation of n samples per prompt, rewarded, with the greedy baseline when an estimator needs it."""
        ctx, n = self.ctx, self.ctx.cfg.actor_rollout_ref.rollout.n
        gen = repeat_with_uids(prompts, n)
        step = ctx.step()
        seed = call_seed(step, attempt)
        out = ctx.workers.rollout.generate_sequences(gen.select(ctx.rollout_keys(gen)), step=step, seed=seed)
        out.non_tensors.update(gen.non_tensors)
        with timer("reward"):
            out.union(ctx.reward_fn(out))
        greedy = self.baseline.launch(prompts, step, seed)
        if greedy is not None:
            with timer("gen_baseline"):
                out["reward_baselines"] = self.baseline.rewards(greedy, prompts, n)
        return out

    def _trim(self, batch: Batch, n: int, target: int) -> Batch:
        """Whole groups, a multiple of the data-parallel world, at most the batch size."""
        if len(batch) == 0:
            raise RuntimeError("dynamic sampling kept no group: every group had identical rewards")
        world = self.ctx.workers.world_size
        usable = (len(batch) // (n * world)) * n * world
        return batch[: min(usable or len(batch), target)]
