"""Rollout role: the generation engine living next to the actor (hybrid engine).

Cycle per step: sync (if the actor changed) -> wake -> generate -> sleep. The
sync pulls full tensors from the colocated actor one parameter at a time, so
the process never holds a second full copy of the model in flight.

Tensor parallel (`rollout.tensor_model_parallel_size` = t > 1): consecutive
ranks form TP groups of t; every rank runs one vLLM engine on the shared
torch.distributed world (`external_launcher`), each holding 1/t of the model.
The dispatch sends all ranks of a TP group the same data shard and keeps only
the group's first rank's output (`set_dispatch_info`).
"""

from __future__ import annotations

import os
import time

from rlkit.config.schema import RLConfig
from rlkit.controller import Dispatch, Worker, local_role, register
from rlkit.debug import maybe_break, set_step
from rlkit.protocol import Batch
from rlkit.workers.rollout.base import ROLLOUT_BACKENDS


def _rss_mb() -> float:
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss / 2**20


class RolloutWorker(Worker):
    def __init__(self, cfg: RLConfig, model_path: str) -> None:
        super().__init__()
        self.cfg, self.model_path = cfg, model_path

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        import rlkit.workers.rollout  # noqa: F401  (registers the backends)

        start = time.perf_counter()
        rollout = self.cfg.actor_rollout_ref.rollout
        backend = ROLLOUT_BACKENDS.get(rollout.name)
        tp_kwargs = self._tensor_parallel_setup(rollout.tensor_model_parallel_size)
        self.engine = backend(self.model_path, rollout, **tp_kwargs)
        if rollout.multi_turn.enable:  # the agent loop (tools between turns) drives the engine
            from rlkit.utils.model_loading import load_tokenizer
            from rlkit.workers.rollout.agent_rollout import AgentRollout

            self.engine = AgentRollout(self.engine, load_tokenizer(self.model_path), rollout)
        if rollout.free_cache_engine:
            self.engine.sleep(rollout.sleep_level)
        return {"backend": rollout.name, "init_s": time.perf_counter() - start}

    def _tensor_parallel_setup(self, tp: int) -> dict:
        """Place this rank in its TP group; returns the backend's extra constructor arguments."""
        if tp == 1:
            return {}
        from rlkit.config.checks import check_tensor_parallel
        from rlkit.workers.rollout import tensor_parallel_backends

        check_tensor_parallel(self.cfg, tensor_parallel_backends())
        self.init_distributed()  # vLLM builds its TP groups on this world
        self.set_dispatch_info(self.rank // tp, self.world_size // tp, self.rank % tp == 0)
        return {"engine_kwargs": {"distributed_executor_backend": "external_launcher"}}

    @register(dispatch=Dispatch.DP_COMPUTE)
    def generate_sequences(self, batch: Batch, validate: bool = False, call_id: int = 0, greedy: bool = False,
                           stay_awake: bool = False) -> Batch:
        """One response per row. `call_id` (the driver's step) seeds sampling: reproducible on resume,
        and never the same draws twice (a fixed seed would replay them every step). `greedy=True`
        decodes with argmax under the training settings (ReMax's baseline response). `stay_awake=True`
        skips the sleep after generating (more calls follow at once: validation in chunks)."""
        if not validate:
            set_step(call_id // 1000)  # call_id = global_step * 1000 + attempt; roles share the process
        maybe_break("rollout.validate" if validate else "rollout.generate")
        rollout = self.cfg.actor_rollout_ref.rollout
        start = time.perf_counter()
        rss_sleep = _rss_mb()
        self.engine.wake_up()
        rss_awake = _rss_mb()
        sampling = rollout.to_val_sampling() if validate else rollout.to_sampling(greedy=greedy)
        if rollout.seed is not None:
            # the data-parallel rank: the ranks of one TP group must draw the same samples
            sampling.seed = (rollout.seed * 1_000_003 + call_id * 7919 + self.dispatch_info().dp_rank) % 2**31
        out = self.engine.generate(batch, sampling)
        gen_s = time.perf_counter() - start
        if rollout.free_cache_engine and not stay_awake:
            self.engine.sleep(rollout.sleep_level)
        tokens = float(out["response_mask"].sum())
        out.meta["metrics"] = {
            **out.meta.get("metrics", {}),  # the agent loop's num_turns/*, tool_calls/*, ...
            "timing_s/generate_sequences": gen_s,  # this worker's; the driver's whole stage is timing_s/gen
            "perf/rollout_tokens_per_s": tokens / max(gen_s, 1e-9),
            "perf/rollout_rss_mb_asleep": rss_sleep,
            "perf/rollout_rss_mb_awake": rss_awake,
        }
        return out

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_weights(self) -> dict:
        """Stream the actor's current weights into the engine (every rank takes part in the gather)."""
        start = time.perf_counter()
        actor = local_role("actor")
        nbytes = self.engine.update_weights(actor.model.iter_full_params())
        return {"timing_s/rollout_load_weights": time.perf_counter() - start,
                "perf/update_weights_mb": nbytes / 2**20}  # the driver times the whole call: timing_s/update_weights
