"""The single-controller fit loop shared by every algorithm (GRPO, PPO, RLOO, REINFORCE++, DAPO...).

The algorithm is chosen by registry names in the config; the loop never
branches on them. Read `train_step` top to bottom: it is the RL algorithm.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlkit.algo.dapo import dynamic_sampling_filter
from rlkit.algo.kl import make_kl_controller
from rlkit.algo.metrics import compute_data_metrics
from rlkit.algo.run_needs import run_needs
from rlkit.config.schema import RLConfig
from rlkit.protocol import Batch
from rlkit.rollout.lifecycle import call_seed
from rlkit.trainer.key_checks import check_batch_keys
from rlkit.trainer.rollout_flow import (
    Timer,
    compute_advantages,
    reduce_worker_metrics,
    repeat_with_uids,
    shape_rewards,
    validation_metrics,
)
from rlkit.trainer.step_result import StepResult
from rlkit.trainer.workers_setup import WorkerHandles, build_workers
from rlkit.workers.micro_batch import balance_across_ranks

log = logging.getLogger("rlkit.trainer")
PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


@dataclass
class FitSummary:
    steps: int = 0
    first_val: dict[str, float] = field(default_factory=dict)
    last_val: dict[str, float] = field(default_factory=dict)
    train_scores: list[float] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)  # empty unless the scorer reports `acc`
    step_seconds: list[float] = field(default_factory=list)
    checkpoint: str | None = None
    log_dir: str | None = None
    memory_peaks: dict[str, float] = field(default_factory=dict)  # memory/<method>/<name>: the max over steps


class RLTrainer:
    """Owns the data, the reward manager and the worker groups; `fit()` runs the loop."""

    def __init__(self, cfg: RLConfig, workers: WorkerHandles | None = None, tracker: Any = None) -> None:
        from rlkit.data import RLDataLoader, RLDataset
        from rlkit.models.loading import load_tokenizer
        from rlkit.models.resolve import resolve_model_path
        from rlkit.reward.mix import build_reward_fn
        from rlkit.reward.registry import build_reward_manager

        self.cfg = cfg
        self.model_path = str(resolve_model_path(cfg.actor_rollout_ref.model.path))
        self.tokenizer = load_tokenizer(self.model_path)
        d = cfg.data
        self.train_set = RLDataset(d.train_files, self.tokenizer, d.max_prompt_length, d.truncation, d.prompt_key)
        self.train_loader = RLDataLoader(self.train_set, d.train_batch_size, shuffle=d.shuffle, seed=d.seed)
        self.val_set = (
            RLDataset(d.val_files, self.tokenizer, d.max_prompt_length, d.truncation, d.prompt_key,
                      max_samples=d.val_max_samples)
            if d.val_files else None
        )
        if len(self.train_loader) == 0:
            raise_user(f"data.train_batch_size={d.train_batch_size} is larger than the {len(self.train_set)} "
                       f"training prompts in {d.train_files}; lower it")
        self.total_steps = cfg.trainer.total_training_steps or len(self.train_loader) * cfg.trainer.total_epochs
        manager = build_reward_manager(cfg, self.tokenizer)  # reward_model.reward_manager, before workers start
        kl = cfg.algorithm.kl_ctrl
        self.kl_ctrl = make_kl_controller(kl.type, kl_coef=kl.kl_coef, target_kl=kl.target_kl, horizon=kl.horizon)
        self.workers = workers or self._build_workers()
        if cfg.trainer.debug.check_batch_keys:
            check_batch_keys(self.workers)
        # the reward stage (rlkit.reward.mix): the reward manager, mixed with the model reward when enabled
        self.reward_fn = build_reward_fn(cfg, self.tokenizer, {"reward_model": self.workers.reward_model},
                                         manager=manager)
        self.mfu_meter = _mfu_meter(cfg, self.model_path)
        self.global_step = 0
        self.tracker = tracker
        self.ckpt_root = Path(cfg.trainer.default_local_dir).expanduser()

    # ------------------------------------------------------------------ loop
    def fit(self) -> FitSummary:
        summary = FitSummary()
        self._maybe_resume()
        if self.val_set is not None and self.cfg.trainer.val_before_train:
            summary.first_val = self.validate()
            self._log(summary.first_val)
        self._data_iter = data_iter = self._batches()
        while self.global_step < self.total_steps:
            prompts = next(data_iter)
            self.global_step += 1
            self.workers.set_step(self.global_step)  # every later worker call carries it (break_at `step=`)
            start = time.perf_counter()
            result = self.train_step(prompts)
            step_s = time.perf_counter() - start
            metrics = result.log_row(step_s, self.mfu_meter)
            metrics.update(self.memory_metrics())
            for key, value in metrics.items():
                if key.startswith("memory/"):
                    summary.memory_peaks[key] = max(summary.memory_peaks.get(key, 0.0), value)
            metrics["training/epoch"] = self.train_loader.epoch
            summary.train_scores.append(metrics.get("critic/score/mean", float("nan")))
            if "reward/acc/mean" in metrics:
                summary.train_acc.append(metrics["reward/acc/mean"])
            summary.step_seconds.append(step_s)
            last = self.global_step == self.total_steps
            tf = self.cfg.trainer.test_freq
            if self.val_set is not None and (last or (tf > 0 and self.global_step % tf == 0)):
                summary.last_val = self.validate()
                metrics.update(summary.last_val)
            self._log(metrics)  # before the save: a stop in between replays (and rewinds) this step, never loses it
            sf = self.cfg.trainer.save_freq
            if last or (sf > 0 and self.global_step % sf == 0):
                summary.checkpoint = str(self.save_checkpoint())
        summary.steps = self.global_step
        return summary

    def train_step(self, prompts: Batch) -> StepResult:
        cfg, w, timer = self.cfg, self.workers, Timer()
        with timer("gen"):
            batch, gen_metrics = self._rollout(prompts, timer)
        if cfg.trainer.balance_batch:
            batch.reorder(balance_across_ranks(batch, w.world_size))
        one_pass = cfg.actor_rollout_ref.actor.ppo_epochs == 1 and (
            cfg.actor_rollout_ref.actor.ppo_mini_batch_size == cfg.data.train_batch_size
        )
        if cfg.actor_rollout_ref.actor.recompute_old_log_prob or not one_pass or cfg.algorithm.use_kl_in_reward:
            with timer("old_log_prob"):
                batch.union(w.actor.compute_log_prob(batch))
            if "rollout_log_probs" in batch:
                gap = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * batch["response_mask"]
                gen_metrics["rollout/log_prob_abs_diff"] = float(gap.sum() / batch["response_mask"].sum().clamp(min=1))
        if w.ref is not None:
            with timer("ref"):
                batch.union(w.ref.compute_ref_log_prob(batch))
        if w.critic is not None:
            with timer("values"):
                batch.union(w.critic.compute_values(batch))
        with timer("adv"):
            gen_metrics.update(shape_rewards(batch, cfg, self.kl_ctrl))
            compute_advantages(batch, cfg)
        if w.critic is not None:
            with timer("update_critic"):
                batch.union(w.critic.update_critic(batch))
        with timer("update_actor"):
            batch.union(w.actor.update_actor(batch))
        with timer("update_weights"):
            sync = w.sync_weights()
        worker_metrics = batch.meta.get("metrics", {})
        metrics = {
            **reduce_worker_metrics(worker_metrics),
            **reduce_worker_metrics({k: [s[k] for s in sync] for k in sync[0]}),
            **compute_data_metrics(batch), **gen_metrics,
        }
        mask = batch["attention_mask"]
        flops = self.mfu_meter.step_flops(mask, timer.seconds) if self.mfu_meter is not None else None
        return StepResult(metrics, dict(timer.seconds), tokens=float(mask.sum()), flops=flops)

    # ------------------------------------------------------------- rollout
    def _rollout(self, prompts: Batch, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Generate n samples per prompt and score them; with dynamic sampling, refill until the batch is full."""
        cfg = self.cfg
        n = cfg.actor_rollout_ref.rollout.n
        kept: list[Batch] = []
        metrics: dict[str, float] = {}
        target = len(prompts) * n
        filt = cfg.algorithm.filter_groups
        for attempt in range(max(1, filt.max_num_gen_batches if filt.enable else 1)):
            if attempt > 0:
                prompts = next(self._data_iter)
            gen = repeat_with_uids(prompts, n)
            step, seed = self.global_step, call_seed(self.global_step, attempt)
            out = self.workers.rollout.generate_sequences(gen.select(self._rollout_keys(gen)), step=step, seed=seed)
            out.non_tensors.update(gen.non_tensors)
            with timer("reward"):
                out.union(self.reward_fn(out))
            baseline = self._launch_baseline(prompts, step, seed)
            if baseline is not None:
                with timer("gen_baseline"):
                    out["reward_baselines"] = self._baseline_rewards(baseline, prompts, n)
            if not filt.enable:
                return out, {}
            score = out["token_level_scores"].sum(-1)
            result = dynamic_sampling_filter(score.numpy(), out["uid"])
            metrics["dapo/kept_groups"] = metrics.get("dapo/kept_groups", 0) + result.kept_groups
            metrics["dapo/gen_batches"] = attempt + 1
            kept.append(out.index(result.keep_indices))
            if sum(len(k) for k in kept) >= target:
                break
        batch = Batch.concat(kept)
        if len(batch) == 0:
            raise RuntimeError("dynamic sampling kept no group: every group had identical rewards")
        usable = (len(batch) // (n * self.workers.world_size)) * n * self.workers.world_size
        usable = min(usable or len(batch), target)
        return batch[:usable], metrics

    def _launch_baseline(self, prompts: Batch, step: int, seed: int, blocking: bool = True) -> Any:
        """Greedy responses to the un-repeated prompts when an entry declares `@needs(greedy_baseline=True)`
        (ReMax's estimator), else None. Only their rewards are kept; they are not trained on."""
        if not run_needs(self.cfg).greedy_baseline:
            return None
        keys = self._rollout_keys(prompts)
        return self.workers.rollout.generate_sequences(prompts.select(keys), step=step, seed=seed, greedy=True,
                                                       blocking=blocking)

    def _baseline_rewards(self, greedy: Batch, prompts: Batch, n: int) -> torch.Tensor:
        """Score the greedy responses with the same reward manager; one value per sample row ((B*n,))."""
        greedy.non_tensors.update(prompts.non_tensors)
        return self.reward_fn(greedy)["token_level_scores"].sum(-1).float().repeat_interleave(n)

    def _rollout_keys(self, gen: Batch) -> list[str]:
        """Prompt tensors; with multi-turn also the raw messages and tool/interaction kwargs the agent loop reads."""
        if not self.cfg.actor_rollout_ref.rollout.multi_turn.enable:
            return PROMPT_KEYS
        from rlkit.rollout.agent_rollout import agent_input_keys

        return PROMPT_KEYS + agent_input_keys(gen)

    def _batches(self):
        while True:
            yield from self.train_loader

    def _build_workers(self) -> WorkerHandles:
        """The worker groups of the layout the config asks for (colocated, or a separate rollout group)."""
        return build_workers(self.cfg, self.model_path, self.total_steps)

    # ----------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        assert self.val_set is not None
        start = time.perf_counter()
        n = self.cfg.actor_rollout_ref.rollout.val_kwargs.n
        total = len(self.val_set)
        bs = self.cfg.data.val_batch_size or val_chunk_size(total)
        outs = []
        self._progress(VAL_PHASE, 0, total)
        for i in range(0, total, bs):
            end = min(i + bs, total)
            prompts = self.val_set.get_batch(np.arange(i, end))
            gen = repeat_with_uids(prompts, n)
            out = self.workers.rollout.generate_sequences(gen.select(self._rollout_keys(gen)), validate=True,
                                                          stay_awake=end < total)  # one wake/sleep per pass
            out.non_tensors.update(gen.non_tensors)
            out.union(self.reward_fn(out))
            outs.append(out)
            self._progress(VAL_PHASE, end, total)
        batch = Batch.concat(outs)
        metrics = validation_metrics(batch, n)
        # each reward component's mean (reward/rule|rm|judge/mean, rlkit.reward.mix), as in training
        for key, values in batch.meta.get("metrics", {}).items():
            if key.startswith("reward/") and key.endswith("/mean") and key.count("/") == 2 and values:
                metrics[f"val/{key}"] = float(np.mean(values))
        metrics["timing_s/validate"] = time.perf_counter() - start
        for key, value in self.memory_metrics().items():  # validation's own peaks, apart from the step's
            name = "memory/validate/" + key.rsplit("/", 1)[1]
            metrics[name] = max(metrics.get(name, 0.0), value)
        return metrics

    def memory_metrics(self) -> dict[str, float]:
        """Each worker call's peak memory since the last pop (`memory/<method>/rss_peak_gb`, and the CUDA
        allocator's on GPU), max over workers; groups still generating (async modes) are left for later."""
        return self.workers.memory_peaks(skip=self.busy_groups())

    def busy_groups(self) -> tuple[Any, ...]:
        """Worker groups with a call in flight between steps: none in the synchronous loop."""
        return ()

    # ---------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        from rlkit.utils.checkpoint_io import begin_checkpoint, commit_checkpoint, save_rng_state

        tmp = begin_checkpoint(self.ckpt_root, self.global_step)
        self.workers.actor.save_checkpoint(str(tmp / "actor"))
        if self.workers.critic is not None:
            self.workers.critic.save_checkpoint(str(tmp / "critic"))
        self.tokenizer.save_pretrained(tmp / "actor" / "tokenizer")
        state = {
            "global_step": self.global_step,
            "dataloader": self.train_loader.state_dict(),
            "rng": save_rng_state(),
            "kl_coef": float(self.kl_ctrl.value),
        }
        torch.save(state, tmp / "trainer_state.pt")
        (tmp / "config.json").write_text(json.dumps(_plain(self.cfg), indent=1, default=str))
        required = ["trainer_state.pt", "config.json", "actor/.metadata", "actor/hf_config/config.json"]
        required += ["critic/.metadata"] if self.workers.critic is not None else []
        return commit_checkpoint(self.ckpt_root, tmp, self.global_step, self.cfg.trainer.max_actor_ckpt_to_keep,
                                 required=required)

    def _maybe_resume(self) -> None:
        """Load the checkpoint resume_mode picks (auto: the newest that loads, saying which it skipped)."""
        from rlkit.utils.checkpoint_io import load_with_fallback

        path = load_with_fallback(self.ckpt_root, self.cfg.trainer.resume_mode, self._load_checkpoint, log.warning)
        if path is None:
            if self.cfg.trainer.separate_rollout and self.cfg.actor_rollout_ref.model.lora_adapter_path:
                # the separate engine loaded the base folder; the actor starts from the adapter: push it first
                # (colocated engines load it themselves when built: RolloutWorker.init_model)
                self.workers.sync_weights(wait=True)
            return
        self.workers.sync_weights(wait=True)  # the resumed weights are in the engines before step 1
        if self.tracker is not None and hasattr(self.tracker, "rewind"):
            self.tracker.rewind(self.global_step)  # the steps after the checkpoint run again: drop their old rows

    def _load_checkpoint(self, path: Path) -> None:
        from rlkit.utils.checkpoint_io import load_rng_state

        log.warning("resuming from %s", path)
        self.workers.actor.load_checkpoint(str(path / "actor"))
        if self.workers.critic is not None and (path / "critic").exists():
            self.workers.critic.load_checkpoint(str(path / "critic"))
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        self.global_step = int(state["global_step"])
        self.train_loader.load_state_dict(state["dataloader"])
        load_rng_state(state["rng"])
        try:
            self.kl_ctrl.value = state.get("kl_coef", self.kl_ctrl.value)
        except AttributeError:  # a controller whose value is derived, not stored
            pass

    def _progress(self, phase: str, done: int, total: int) -> None:
        if self.tracker is not None and hasattr(self.tracker, "progress"):
            self.tracker.progress(phase, done, total)

    def _log(self, metrics: dict[str, Any]) -> None:
        if self.tracker is not None:
            self.tracker.log(metrics, step=self.global_step)


VAL_PHASE = "validation prompts"
VAL_CHUNKS, VAL_MIN_CHUNK = 10, 64


def val_chunk_size(total: int) -> int:
    """Prompts per validation call when data.val_batch_size is null: about VAL_CHUNKS calls (so the console
    shows progress and an ETA), never fewer than VAL_MIN_CHUNK prompts per call (the engine stays busy)."""
    return max(VAL_MIN_CHUNK, -(-total // VAL_CHUNKS))


def raise_user(msg: str) -> None:
    from rlkit.errors import UserError

    raise UserError(msg)


def _mfu_meter(cfg: RLConfig, model_path: str):
    """perf/mfu's FLOP counter and peak (rlkit.utils.flops); None (no perf/mfu) if the model config is unreadable."""
    from rlkit.utils.flops import MFUMeter
    from rlkit.workers.fsdp_model import resolve_dtype

    try:
        import ray

        gpu = cfg.trainer.device == "cuda" or (
            cfg.trainer.device == "auto" and ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
        )
        dtype = resolve_dtype(cfg.actor_rollout_ref.actor.fsdp_config.param_dtype,
                              torch.device("cuda" if gpu else "cpu"))
        return MFUMeter.for_run(cfg, model_path, gpu, dtype)
    except Exception as exc:  # a metric must never stop a run
        log.warning("perf/mfu disabled: %s", exc)
        return None


def _plain(cfg: RLConfig) -> dict:
    from rlkit.config.load import to_dict

    return to_dict(cfg)


__all__ = ["RLTrainer", "FitSummary"]
