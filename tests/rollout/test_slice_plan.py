"""The slice planner's arithmetic (rlkit/rollout/slice_plan.py) against vLLM's tensor-parallel layouts, no engine:
a fused QKV with GQA and key/value heads replicated over ranks, a merged gate/up, a padded vocabulary."""

from __future__ import annotations


def test_slice_planner_qkv_gqa_and_padded_vocab():
    """The planner's arithmetic against vLLM's layouts: a fused QKV with GQA (8 query, 2 key/value heads of 16;
    at TP 4 each key/value head lives on 2 ranks) and a 60-token vocabulary padded to 64 before the split."""
    from rlkit.rollout.slice_plan import chunk_piece, merged_cut, qkv_cut, vocab_cut

    hd = 16
    for rank in range(4):
        q, k, v = (qkv_cut("x", "qkv", 0, s, heads=2, kv_heads=1, head_size=hd, v_head_size=hd, kv_replicas=2,
                           tp_rank=rank) for s in "qkv")
        assert (q.start, q.length, q.dest_start) == (rank * 2 * hd, 2 * hd, 0)
        assert (k.start, k.length, k.dest_start) == (rank // 2 * hd, hd, 2 * hd)
        assert (v.start, v.length, v.dest_start) == (rank // 2 * hd, hd, 3 * hd)
        assert q.is_chunk(8 * hd, 4, rank)  # Shard(0) of q_proj is this rank's rows: re-cut, no gather
        assert not k.is_chunk(2 * hd, 4, rank)  # half a head per rank under torch.chunk: gathered and narrowed
    at_tp2 = [qkv_cut("x", "qkv", 0, "k", heads=4, kv_heads=1, head_size=hd, v_head_size=hd, kv_replicas=1,
                      tp_rank=r) for r in range(2)]
    assert all(c.is_chunk(2 * hd, 2, r) for r, c in enumerate(at_tp2))
    up = merged_cut("up", "gate_up", 0, 1, output_sizes=[256, 256], tp_size=2, tp_rank=1)
    assert (up.start, up.length, up.dest_start) == (128, 128, 128) and up.is_chunk(256, 2, 1)
    # vLLM: 60 rows padded to 64, 32 per rank: rank 0 rows [0, 32), rank 1 rows [32, 60) + 4 zero rows
    r0, r1 = vocab_cut("e", "e", 0, start=0, end=32, padded=32), vocab_cut("e", "e", 0, start=32, end=60, padded=32)
    assert (r1.start, r1.length, r1.pad_to) == (32, 28, 32)
    assert chunk_piece(60, 2, 0) == (0, 30) and not r0.is_chunk(60, 2, 0) and not r1.is_chunk(60, 2, 1)
    assert vocab_cut("e", "e", 0, start=64, end=128, padded=64).is_chunk(128, 2, 1)
