"""Weights from the actor to engines in processes of their own (one-step-off, fully async; on nodes of their own
with `rollout.nnodes`) by a collective broadcast, bucket by bucket, instead of through Ray's object store.

One process group joins the actor's rank 0 (the sender, rank 0 of the group) and every engine process (ranks
1..N): gloo on CPU, NCCL on GPUs (`BACKENDS`), made beside each process's own group from a store rank 0 hosts on
its node's routable address. A sync: every actor rank iterates the full parameters (the FSDP all-gathers are a
collective of the actor's group), rank 0 packs them into buckets of at most `rollout.update_weights_bucket_megabytes`
(a tensor larger than that goes alone) and broadcasts each as a header (names, dtypes, shapes) and one flat
byte buffer; every engine receives a bucket, hands its tensors to the engine's loader and receives the next
when the loader asks (a generator): each side holds at most one bucket beyond the model it has.
"""

from __future__ import annotations

import datetime
import math
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
_LENGTH = torch.int64


@dataclass
class WeightGroup:
    """This process's membership of the weight broadcast group (rank 0: the actor's rank 0)."""

    pg: Any
    rank: int
    world: int
    device: torch.device

    @classmethod
    def join(cls, addr: str, port: int, rank: int, world: int, device: torch.device, timeout_s: int) -> WeightGroup:
        """Join the group whose store rank 0 serves at addr:port (every member calls this at the same time)."""
        from rlkit.controller.worker import rendezvous_store

        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.PrefixStore("rlkit-weights", rendezvous_store(addr, port, rank, world, timeout))
        if BACKENDS[device.type] == "nccl":
            pg = dist.ProcessGroupNCCL(store, rank, world)
        else:
            pg = dist.ProcessGroupGloo(store, rank, world, timeout)
        return cls(pg, rank, world, device)

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()
        return tensor

    # ------------------------------------------------------------------ the actor's rank 0
    def send(self, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> dict[str, float]:
        """Broadcast every (name, tensor) in buckets, then the end mark; returns bytes and buckets sent."""
        bucket: list[tuple[str, torch.Tensor]] = []
        size = sent = buckets = 0
        for name, tensor in named:
            if bucket and size + tensor.numel() * tensor.element_size() > bucket_bytes:
                sent, buckets = sent + self._send_bucket(bucket), buckets + 1
                bucket, size = [], 0
            bucket.append((name, tensor.detach()))
            size += tensor.numel() * tensor.element_size()
        if bucket:
            sent, buckets = sent + self._send_bucket(bucket), buckets + 1
        self._broadcast(torch.zeros(1, dtype=_LENGTH, device=self.device))  # the end: a header of length 0
        return {"perf/weight_broadcast_mb": sent / 2**20, "perf/weight_broadcast_buckets": float(buckets)}

    def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> int:
        header = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in bucket]
        raw = torch.frombuffer(bytearray(pickle.dumps(header)), dtype=torch.uint8).to(self.device)
        self._broadcast(torch.tensor([raw.numel()], dtype=_LENGTH, device=self.device))
        self._broadcast(raw)
        flat = torch.cat([t.to(self.device).contiguous().reshape(-1).view(torch.uint8) for _, t in bucket])
        self._broadcast(flat)
        return flat.numel()

    # ------------------------------------------------------------------ an engine
    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of each bucket as it arrives, until the end mark (views of the bucket's buffer)."""
        while True:
            length = int(self._broadcast(torch.zeros(1, dtype=_LENGTH, device=self.device)).item())
            if length == 0:
                return
            raw = self._broadcast(torch.empty(length, dtype=torch.uint8, device=self.device))
            header = pickle.loads(raw.cpu().numpy().tobytes())
            nbytes = [_nbytes(dtype, shape) for _, dtype, shape in header]
            flat = self._broadcast(torch.empty(sum(nbytes), dtype=torch.uint8, device=self.device))
            offset = 0
            for (name, dtype, shape), n in zip(header, nbytes):
                yield name, flat[offset:offset + n].view(getattr(torch, dtype)).reshape(shape)
                offset += n


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * getattr(torch, dtype).itemsize


@dataclass
class BroadcastWeights:
    """A weight source for `EngineLifecycle.load`: the buckets the actor's rank 0 is broadcasting."""

    group: WeightGroup

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.group.receive()

    def load_into(self, engine: Any) -> int:
        received = self.named_tensors()
        nbytes = engine.update_weights(received)
        for _ in received:  # an engine that stopped early: the rest of the broadcast is still received
            pass
        return nbytes
