"""The RL trainer: one class for every algorithm (GRPO, PPO, RLOO, REINFORCE++, DAPO, ReMax...) and every rollout
mode. The algorithm is chosen by registry names in the config and the rollout mode by the rollout source
(synchronous, one-step-off, fully async: rlkit/trainer/step/rollout_source.py); the step never branches on either.
Read `train_step` top to bottom: it is the RL algorithm, in numbered phases. The loop around it (resume,
validation and checkpoint schedules, tracking) is `TrainerBase`'s (rlkit/trainer/run/trainer_base.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlkit.algo.kl import make_kl_controller
from rlkit.algo.metrics import compute_data_metrics
from rlkit.config.schema import RLConfig
from rlkit.data.prompt_stream import PromptStream
from rlkit.debug import set_step
from rlkit.debug.anomaly import check_tensor
from rlkit.protocol import Batch
from rlkit.reward.mix import build_reward_fn
from rlkit.runs.status import PhaseTimer
from rlkit.trainer.replay.step_record import StepRecorder
from rlkit.trainer.run.preflight import log_dir_of
from rlkit.trainer.run.run_plan import RunPlan
from rlkit.trainer.run.trainer_base import FitSummary, TrainerBase
from rlkit.trainer.run.worker_death import find_death
from rlkit.trainer.run.workers_setup import WorkerHandles, rl_workers
from rlkit.trainer.step.advantage_stage import compute_advantages, shape_rewards
from rlkit.trainer.step.fully_async import FullyAsyncRollout
from rlkit.trainer.step.generations import dump, generations, pick
from rlkit.trainer.step.key_checks import check_batch_keys
from rlkit.trainer.step.one_step_off import OneStepOffRollout
from rlkit.trainer.step.rollout_source import (
    RolloutContext,
    RolloutSource,
    SyncRollout,
    repeat_with_uids,
    source_name,
)
from rlkit.trainer.step.step_metrics import reduce_worker_metrics, validation_metrics
from rlkit.trainer.step.step_result import StepResult, Timer
from rlkit.utils.memory_peak import is_call_peak
from rlkit.workers.micro_batch import balance_across_ranks

log = logging.getLogger("rlkit.trainer")


class RLTrainer(TrainerBase):
    """Owns the data, the reward stage, the worker groups and the rollout source; `fit()` runs the loop."""

    check_keys = False  # --debug: check every worker call's output (rlkit/batch_keys.py), restarted workers' too

    def __init__(self, cfg: RLConfig, workers: WorkerHandles | None = None, tracker: Any = None) -> None:
        from rlkit.data import RLDataLoader
        from rlkit.data.user_dataset import dataset_maker, rl_dataset_keys
        from rlkit.data.user_sampler import UserSampler
        from rlkit.models.chat_template import with_chat_template
        from rlkit.models.loading import load_image_processor, load_tokenizer
        from rlkit.models.resolve import resolve_model_path
        from rlkit.reward.registry import build_reward_manager
        from rlkit.reward.scorer_key import missing_key_message

        self.cfg = cfg
        self.model_path = str(with_chat_template(resolve_model_path(cfg.actor_rollout_ref.model.path),
                                                 cfg.actor_rollout_ref.model.custom_chat_template,
                                                 cfg.trainer.default_local_dir))
        self.tokenizer = load_tokenizer(self.model_path)
        d = cfg.data
        self.image_processor = load_image_processor(self.model_path, d.mm_processor_kwargs)  # None: a text model
        make_dataset = dataset_maker(d, self.tokenizer, self.image_processor,  # data.custom_cls
                                     **rl_dataset_keys(d, self.image_processor))
        self.train_set = make_dataset(d.train_files, d.train_max_samples)
        self.user_sampler = (UserSampler(d.sampler.class_path, d.sampler.class_name, self.train_set, d)
                             if d.sampler.class_path else None)  # verl's data.sampler
        # a loader batch is one generation batch: train_batch_size prompts, or gen_batch_size with dynamic sampling
        self.train_loader = RLDataLoader(self.train_set, d.gen_batch_size, shuffle=d.shuffle, seed=d.seed,
                                         order_fn=self.user_sampler.order if self.user_sampler else None)
        self.val_set = make_dataset(d.val_files, d.val_max_samples) if d.val_files else None
        if len(self.train_loader) == 0:
            key = "gen_batch_size" if d.gen_batch_size != d.train_batch_size else "train_batch_size"
            raise_user(f"data.{key}={d.gen_batch_size} is larger than the {len(self.train_set)} "
                       f"training prompts in {d.train_files}; lower it")
        if d.reward_fn_key not in self.train_set.columns:
            raise_user(missing_key_message(d.reward_fn_key, self.train_set.columns))
        self.total_steps = cfg.trainer.total_training_steps or len(self.train_loader) * cfg.trainer.total_epochs
        manager = build_reward_manager(cfg, self.tokenizer)  # reward_model.reward_manager, before workers start
        kl = cfg.algorithm.kl_ctrl
        self.kl_ctrl = make_kl_controller(kl.type, kl_coef=kl.kl_coef, target_kl=kl.target_kl, horizon=kl.horizon)
        self.reward_manager = manager
        self.plan = RunPlan.of(cfg)  # what the algorithm needs and where each role runs, resolved once
        self._attach(workers or self._build_workers())
        self.mfu_meter = _mfu_meter(cfg, self.model_path)
        self.global_step = 0
        self.validations = 0  # validation passes so far (seeds data.validation_shuffle's order)
        self.tracker = tracker
        self.ckpt_root = Path(cfg.trainer.default_local_dir).expanduser()
        self.recorder = StepRecorder(cfg, self.model_path, self.total_steps, log_dir_of(cfg), self.workers.world_size,
                                     lambda: self.workers.groups[0].rng_states())  # trainer.debug.record_steps

    def _attach(self, workers: WorkerHandles) -> None:
        """What stands on the worker groups: the reward stage and the rollout source (built again on a restart)."""
        cfg = self.cfg
        self.workers = workers
        if cfg.trainer.debug.check_batch_keys or self.check_keys:
            check_batch_keys(workers)
        # the reward stage (rlkit.reward.mix): the reward manager, mixed with the model reward when enabled
        self.reward_fn = build_reward_fn(cfg, self.tokenizer, {"reward_model": workers.reward_model},
                                         manager=self.reward_manager)
        self.teacher = _teacher_stage(cfg, self.tokenizer, workers)  # distillation: None when off
        self.rollout_ctx = RolloutContext(cfg, workers, self.reward_fn, PromptStream(self.train_loader),
                                          lambda: self.global_step, self.total_steps, self.model_path, self.tokenizer,
                                          self.plan)
        self.source = ROLLOUT_SOURCES[source_name(cfg)](self.rollout_ctx)  # sync, one-step-off, fully async

    # ------------------------------------------------------------------ step
    def run_step(self) -> StepResult:
        self.workers.set_step(self.global_step)  # every later worker call carries it (break_at `step=`)
        set_step(self.global_step)  # and the driver's own checks (--debug nan) name it
        self.recorder.start(self.global_step)
        try:
            return self.train_step()
        except Exception as exc:
            self.recorder.failed(self.global_step, exc)  # its batch, for `rlkit debug replay`
            raise

    def finish_row(self, result: StepResult, step_s: float) -> dict[str, float]:
        row = result.log_row(step_s, self.mfu_meter)
        row.update(self.memory_metrics())
        row["training/epoch"] = self.train_loader.epoch
        return row

    def train_step(self) -> StepResult:
        cfg, w, timer = self.cfg, self.workers, PhaseTimer(Timer(), getattr(self, "status", None))  # phase: status.json
        timer = self.hang_watch.watch(timer)  # trainer.hang_timeout_s: a phase that makes no progress is named
        # 1. generate and score: the rollout source's next batch (n samples per prompt, rewarded)
        with timer("gen"):
            batch, gen_metrics = self.source.next_batch(timer)
        check_tensor("reward", batch["token_level_scores"], batch, "(token_level_scores, driver)")  # --debug nan
        if cfg.trainer.balance_batch:
            order = balance_across_ranks(batch, w.world_size)
            batch.reorder(order)
            self.recorder.reordered(order)
        # 2. old log-probs: the policy before this step's update (unneeded for a single on-policy pass);
        # bypass_mode (verl's): the engine's own log-probs stand for it, and no forward runs
        if cfg.algorithm.bypass_mode:
            batch["old_log_probs"] = batch["rollout_log_probs"]
        elif self._needs_old_log_probs():
            with timer("old_log_prob"):
                batch.union(w.actor.compute_log_prob(batch))
            gen_metrics.update(_engine_gap(batch))
        # 3. reference log-probs (KL loss or KL in the reward), 4. values (a critic)
        if w.ref is not None:
            with timer("ref"):
                batch.union(w.ref.compute_ref_log_prob(batch))
        # 3b. distillation: every sampled token's log-prob under its row's teacher (rlkit/trainer/step/teacher_stage.py)
        if self.teacher is not None:
            with timer("teacher"):
                scored, teacher_metrics = self.teacher(batch)
                batch.union(scored)
            gen_metrics.update(teacher_metrics)
        if w.critic is not None:
            with timer("values"):
                batch.union(w.critic.compute_values(batch))
        # 5. rewards -> advantages (driver-side, the registered estimator)
        with timer("adv"):
            gen_metrics.update(shape_rewards(batch, cfg, self.kl_ctrl))
            compute_advantages(batch, cfg)
        self.recorder.before_update(self.global_step, batch)  # trainer.debug.record_steps; a failed step's too
        check_tensor("advantage", batch["advantages"], batch, "(advantages, driver)")
        # 6. critic update, 7. actor update (not in the critic's first `critic_warmup` steps)
        if w.critic is not None:
            with timer("update_critic"):
                batch.union(w.critic.update_critic(batch))
        sync: list[dict[str, float]] = [{}]
        if self.global_step > cfg.trainer.critic_warmup:
            with timer("update_actor"):
                batch.union(w.actor.update_actor(batch))
            # 8. the new weights to the rollout engines
            with timer("update_weights"):
                sync = w.sync_weights()
        if cfg.trainer.rollout_data_dir:  # every sample of the step as text (verl's rollout dump)
            with timer("dump_rollouts"):
                dump(generations(batch, self.tokenizer, self.global_step), cfg.trainer.rollout_data_dir,
                     self.global_step)
        metrics = {
            **reduce_worker_metrics(batch.meta.get("metrics", {})),
            **reduce_worker_metrics({k: [s[k] for s in sync] for k in sync[0]}),
            **compute_data_metrics(batch), **gen_metrics,
        }
        mask = batch["attention_mask"]
        flops = self.mfu_meter.step_flops(mask, timer.seconds) if self.mfu_meter is not None else None
        if self.user_sampler is not None:  # a curriculum sampler sees each trained batch (verl's sampler.update)
            self.user_sampler.update(batch)
        return StepResult(metrics, dict(timer.seconds), tokens=float(mask.sum()), flops=flops)

    def _needs_old_log_probs(self) -> bool:
        """The old-log-prob forward runs unless one on-policy pass lets the update's first forward stand for it;
        an estimator reading `sum_pi_squared` (which only that forward computes) always needs it."""
        cfg = self.cfg
        actor = cfg.actor_rollout_ref.actor
        one_pass = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == cfg.data.train_batch_size
        return (actor.recompute_old_log_prob or not one_pass or cfg.algorithm.use_kl_in_reward
                or self.plan.needs.sum_pi_squared)

    def _build_workers(self) -> WorkerHandles:
        """The worker groups of the layout the config asks for (colocated, or a separate rollout group)."""
        return rl_workers(self.cfg, self.model_path, self.total_steps, plan=self.plan)

    def close(self) -> None:
        self.source.close()

    # ------------------------------------------------------- worker restarts
    def worker_death(self, exc: BaseException) -> str | None:
        death = find_death(self.workers, exc)
        return None if death is None else death.line(self.global_step)

    def restart_workers(self) -> None:
        try:
            self.source.close()  # a source with calls in flight on the dead group
        except Exception as exc:
            log.warning("closing the rollout source after a worker death: %s", exc)
        self.workers.shutdown()
        self._attach(self._build_workers())

    # ----------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        assert self.val_set is not None
        start = time.perf_counter()
        n = self.cfg.actor_rollout_ref.rollout.val_kwargs.n
        total = len(self.val_set)
        bs = self.cfg.data.val_batch_size or val_chunk_size(total)
        order = val_order(total, self.cfg.data.validation_shuffle, self.cfg.data.seed, self.validations)
        self.validations += 1
        outs = []
        self._progress(VAL_PHASE, 0, total)
        for i in range(0, total, bs):
            end = min(i + bs, total)
            prompts = self.val_set.get_batch(order[i:end])
            gen = repeat_with_uids(prompts, n)
            with self.hang_watch.phase("validate"):
                out = self.workers.rollout.generate_sequences(gen.select(self.rollout_ctx.rollout_keys(gen)),
                                                              validate=True, stay_awake=end < total)  # one wake/sleep
            out.non_tensors.update(gen.non_tensors)
            out.union(self.reward_fn(out))
            outs.append(out)
            self._progress(VAL_PHASE, end, total)
        batch = Batch.concat(outs)
        self._record_val_generations(batch)
        metrics = validation_metrics(batch, n)
        # each reward component's mean (reward/rule|rm|judge/mean, rlkit.reward.mix), as in training
        for key, values in batch.meta.get("metrics", {}).items():
            if key.startswith("reward/") and key.endswith("/mean") and key.count("/") == 2 and values:
                metrics[f"val/{key}"] = float(np.mean(values))
        metrics["timing_s/validate"] = time.perf_counter() - start
        for key, value in self.memory_metrics().items():  # validation's own peaks, apart from the step's
            if is_call_peak(key):  # the roles' noted sizes are the step's (the same engine, the same actor)
                name = "memory/validate/" + key.rsplit("/", 1)[1]
                metrics[name] = max(metrics.get(name, 0.0), value)
        return metrics

    def _record_val_generations(self, batch: Batch) -> None:
        """`trainer.validation_data_dir`: every sample to `<dir>/<step>.jsonl`; `trainer.log_val_generations`:
        N of them (input, output, score) to the trackers."""
        t = self.cfg.trainer
        if not (t.log_val_generations or t.validation_data_dir):
            return
        rows = generations(batch, self.tokenizer, self.global_step)
        if t.validation_data_dir:
            dump(rows, t.validation_data_dir, self.global_step)
        if t.log_val_generations and self.tracker is not None and hasattr(self.tracker, "log_generations"):
            samples = [{k: r[k] for k in ("input", "output", "score")} for r in pick(rows, t.log_val_generations)]
            self.tracker.log_generations(samples, step=self.global_step)

    def memory_metrics(self) -> dict[str, float]:
        """Each worker call's peak memory since the last pop (`memory/<method>/rss_peak_gb`, and the CUDA
        allocator's on GPU), max over workers; groups still generating (async modes) are left for later."""
        route_busy = getattr(self.workers.weights, "busy_groups", tuple)()  # a broadcast waiting for the engines
        return self.workers.memory_peaks(skip=(*self.source.busy_groups(), *route_busy))

    # ---------------------------------------------------------- checkpoints
    def save_state(self, folder: Path) -> None:
        self.workers.actor.save_checkpoint(str(folder / "actor"))
        if self.workers.critic is not None:
            self.workers.critic.save_checkpoint(str(folder / "critic"))
        self.tokenizer.save_pretrained(folder / "actor" / "tokenizer")
        if self.image_processor is not None:  # what `rlkit train export` copies for AutoProcessor
            self.image_processor.save_pretrained(folder / "actor" / "tokenizer")

    def required_files(self) -> list[str]:
        files = ["actor/.metadata", "actor/hf_config/config.json"]
        return files + (["critic/.metadata"] if self.workers.critic is not None else [])

    def extra_state(self) -> dict[str, Any]:
        return {"kl_coef": float(self.kl_ctrl.value)}

    def load_state(self, folder: Path) -> None:
        self.workers.actor.load_checkpoint(str(folder / "actor"))
        if self.workers.critic is not None and (folder / "critic").exists():
            self.workers.critic.load_checkpoint(str(folder / "critic"))

    def load_extra_state(self, state: dict[str, Any]) -> None:
        try:
            self.kl_ctrl.value = state.get("kl_coef", self.kl_ctrl.value)
        except AttributeError:  # a controller whose value is derived, not stored
            pass

    def on_resumed(self, path: Path | None) -> None:
        """The resumed weights reach the engines before step 1."""
        if path is not None:
            self.workers.sync_weights(wait=True)
        elif self.cfg.trainer.separate_rollout and self.cfg.actor_rollout_ref.model.lora_adapter_path:
            # the separate engine loaded the base folder; the actor starts from the adapter: push it first
            # (colocated engines load it themselves when built: RolloutWorker.init_model)
            self.workers.sync_weights(wait=True)


def _engine_gap(batch: Batch) -> dict[str, float]:
    """`rollout/log_prob_abs_diff`: how far the engine's log-probs are from the trainer's (when it returned them)."""
    if "rollout_log_probs" not in batch:
        return {}
    gap = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * batch["response_mask"]
    return {"rollout/log_prob_abs_diff": float(gap.sum() / batch["response_mask"].sum().clamp(min=1))}


VAL_PHASE = "validation prompts"
VAL_CHUNKS, VAL_MIN_CHUNK = 10, 64


def val_chunk_size(total: int) -> int:
    """Prompts per validation call when data.val_batch_size is null: about VAL_CHUNKS calls (so the console
    shows progress and an ETA), never fewer than VAL_MIN_CHUNK prompts per call (the engine stays busy)."""
    return max(VAL_MIN_CHUNK, -(-total // VAL_CHUNKS))


def val_order(total: int, shuffle: bool, seed: int, validation: int) -> np.ndarray:
    """The validation rows' visiting order: file order, or (data.validation_shuffle) a permutation seeded by the
    data seed and the validation's number, so each validation of a run differs and reruns repeat them."""
    if not shuffle:
        return np.arange(total)
    return np.random.default_rng([seed, VAL_SEED_STREAM, validation]).permutation(total)


VAL_SEED_STREAM = 1  # keeps validation orders apart from the training order's (seed, epoch) stream


def raise_user(msg: str) -> None:
    from rlkit.errors import UserError

    raise UserError(msg)


def _teacher_stage(cfg: RLConfig, tokenizer: Any, workers: WorkerHandles) -> Any:
    """The distillation teachers' phase (None when distillation is off)."""
    if not cfg.distillation.enabled:
        return None
    from rlkit.trainer.step.teacher_stage import TeacherStage, local_teacher_paths

    return TeacherStage(cfg, tokenizer, workers.teacher, local_teacher_paths(cfg))


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


#: the rollout sources by name (`source_name(cfg)` picks one)
ROLLOUT_SOURCES: dict[str, type[RolloutSource]] = {
    "sync": SyncRollout, "one_step_off": OneStepOffRollout, "fully_async": FullyAsyncRollout,
}
SOURCES = tuple(ROLLOUT_SOURCES.values())

__all__ = ["RLTrainer", "FitSummary"]
