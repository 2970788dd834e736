"""The trainer side of the sliced sync (rlkit/workers/engine_slices.py) on 4 gloo ranks, no engine: every cut of a
DTensor equals the whole tensor narrowed to this rank's engine slice (engine TP groups of consecutive ranks), and it
comes straight from DTensor's re-cut wherever the layouts allow (the gather-and-narrow fallback otherwise):
- FSDP over all 4 ranks (trainer TP 1) into engine TP 2: the FSDP mesh's dimension split in (2, 2), rows and columns;
- uneven rows whose nested chunks differ from FSDP's (6 rows over 4 ranks): gathered, still the right slice;
- trainer (shard 2 x tp 2) into engine TP 2: the trainer's TP dimension is the engine's;
- engine TP 4 over FSDP's 4 ranks; a whole weight; a slice that is not torch.chunk's (a padded vocabulary's).
"""

from __future__ import annotations

import torch

from tests.gloo_workers import gloo_rank, run_on_gloo_workers


def _worker(rank: int, store: str, payload: None, results) -> None:
    with gloo_rank(rank, store, results, world=4):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        from rlkit.rollout.slice_plan import Cut, SlicePlan, SliceStats, chunk_piece
        from rlkit.workers.engine_slices import EngineCutter, engine_slices

        fsdp = init_device_mesh("cpu", (4,), mesh_dim_names=("shard",))
        both = init_device_mesh("cpu", (2, 2), mesh_dim_names=("shard", "tp"))
        full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
        uneven = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)
        cases = [  # (tensor, engine tp, cut dim, should come from the re-cut)
            (distribute_tensor(full, fsdp, [Shard(0)]), 2, 0, True),
            (distribute_tensor(full, fsdp, [Shard(0)]), 2, 1, True),
            (distribute_tensor(uneven, fsdp, [Shard(0)]), 2, 0, False),
            (distribute_tensor(full, both, [Shard(0), Shard(0)]), 2, 0, True),
            (distribute_tensor(full, both, [Shard(0), Shard(1)]), 2, 1, True),
            (distribute_tensor(full, fsdp, [Shard(0)]), 4, 1, True),  # 6 columns over 4: 2, 2, 2 and 0
            (distribute_tensor(full, fsdp, [Shard(0)]), 4, 0, True),
        ]
        for i, (x, tp, dim, direct) in enumerate(cases):
            whole = x.full_tensor()
            start, length = chunk_piece(x.shape[dim], tp, rank % tp)
            got, recut = EngineCutter(tp, rank % tp).cut(x, Cut("w", "w", dim, start, length))
            assert torch.equal(got, whole.narrow(dim, start, length)), (i, rank)
            assert recut == direct, (i, rank, recut)
        x = distribute_tensor(full, fsdp, [Shard(0)])
        got, recut = EngineCutter(2, rank % 2).cut(x, Cut("w", "w"))
        assert torch.equal(got, full) and recut
        vocab = Cut("w", "w", 0, 5 * (rank % 2), 2 if rank % 2 else 5)  # not torch.chunk's 4 + 3 of 7 rows
        seven = distribute_tensor(full[:7], fsdp, [Shard(0)])
        got, recut = EngineCutter(2, rank % 2).cut(seven, vocab)
        assert torch.equal(got, full[:7].narrow(0, vocab.start, vocab.length)) and not recut
        # buckets: at most bucket_bytes each (a tensor larger than a bucket goes alone), every byte counted
        plan = SlicePlan({"a": Cut("a", "a", 0, *chunk_piece(8, 2, rank % 2)), "b": Cut("b", "b")}, 2, rank % 2, 100)
        stats = SliceStats()
        named = [("a", distribute_tensor(full, fsdp, [Shard(0)])), ("b", distribute_tensor(full, fsdp, [Shard(0)])),
                 ("skipped", distribute_tensor(full, fsdp, [Shard(0)]))]
        buckets = list(engine_slices(iter(named), plan, stats))
        assert [[c.name for c, _ in b] for b in buckets] == [["a"], ["b"]]
        assert stats.sharded_bytes == 4 * 6 * 4 and stats.sharded_full_bytes == 8 * 6 * 4
        assert stats.bytes == stats.sharded_bytes + 8 * 6 * 4 and stats.peak_bucket_bytes == 8 * 6 * 4


def test_engine_cuts_on_four_gloo_ranks(tmp_path):
    run_on_gloo_workers(_worker, None, tmp_path, world=4)
