"""The CPU engine's KV cache freed while the engine sleeps, allocated again on wake.

vLLM's CPU worker ignores sleep mode, so without this the KV cache stays resident through the
actor's update: memory the update could use (the GPU engine frees it at sleep level 1). The cache
is a few large tensors that many views share (the model runner's list, each attention layer's bound
cache); resizing their storages to 0 bytes in place frees the memory while every view keeps pointing
at the same storage, and resizing back (zero-filled) restores them. The content is dead anyway:
sleeping drops the prefix cache. Both functions run inside the vLLM worker (`collective_rpc`).
"""

from __future__ import annotations

import torch

_STASH = "_rlkit_released_kv"  # on the worker: [(storage, nbytes)] while released


def _storages(worker) -> list[torch.UntypedStorage]:
    unique: dict[int, torch.UntypedStorage] = {}
    for tensor in worker.model_runner.kv_caches:
        storage = tensor.untyped_storage()
        unique.setdefault(storage.data_ptr(), storage)
    return list(unique.values())


def release_kv_cache(worker) -> int:
    """Free the KV cache storages; returns the bytes freed (0 when already released or nothing to free)."""
    if getattr(worker, _STASH, None):
        return 0
    released = [(s, s.nbytes()) for s in _storages(worker) if s.nbytes() > 0 and s.resizable()]
    for storage, _ in released:
        storage.resize_(0)
    setattr(worker, _STASH, released)
    return sum(n for _, n in released)


def restore_kv_cache(worker) -> int:
    """Allocate the released storages again, zero-filled; returns the bytes restored."""
    released = getattr(worker, _STASH, None) or []
    for storage, nbytes in released:
        storage.resize_(nbytes)
        storage.fill_(0)
    setattr(worker, _STASH, None)
    return sum(n for _, n in released)
