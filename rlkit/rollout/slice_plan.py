"""Which part of each trainer weight one tensor-parallel engine rank needs, and where it lands (pure, no vLLM).

A `Cut` says: this engine rank needs rows `[start, start + length)` of dimension `dim` of the HF tensor `name`
(`dim=None`: the whole tensor) and writes them at offset `dest_start` along the same dimension of the engine's
parameter `dest` (a fused `qkv_proj`/`gate_up_proj` holds several HF tensors side by side). The numbers come from
the engine's layers (rlkit/rollout/vllm_slices.py reads them from vLLM's own attributes); the functions here only
do the arithmetic, so the layouts are unit-tested without an engine.

The trainer cuts its DTensor to this rank's slice with DTensor's own re-cut (`redistribute` to `Shard(dim)` over
the engine's TP group, rlkit/workers/engine_slices.py) when the slice is exactly torch.chunk's piece of that rank
(`Cut.is_chunk`); where vLLM splits differently (GQA key/value heads replicated over more ranks than there are
heads, a vocabulary padded before it is split) the trainer gathers the whole tensor and narrows it, and the rank
still receives only its slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cut:
    """One engine rank's slice of one HF tensor and where it goes in the engine's parameter."""

    name: str  # the HF (trainer) name
    dest: str  # the engine parameter's dotted name
    dim: int | None = None  # None: the whole tensor (norms, a replicated bias)
    start: int = 0  # in the HF tensor, along dim
    length: int = 0
    dest_start: int = 0  # in the engine parameter, along dim
    pad_to: int = 0  # > start + length: rows [length, pad_to) of the engine's parameter are zeroed (padded vocab)

    def is_chunk(self, size: int, parts: int, index: int) -> bool:
        """The slice is torch.chunk's piece `index` of `parts` along `dim` (what DTensor's Shard(dim) holds)."""
        return self.dim is not None and chunk_piece(size, parts, index) == (self.start, self.length)


def chunk_piece(size: int, parts: int, index: int) -> tuple[int, int]:
    """(start, length) of torch.chunk's piece `index` when `size` rows are split in `parts` (DTensor's Shard)."""
    step = -(-size // parts)
    start = min(step * index, size)
    return start, min(step, size - start)


def column_cut(name: str, dest: str, dim: int, local: int, tp_rank: int) -> Cut:
    """A column-parallel weight (or bias): `local` output rows per rank, rank r's at r * local."""
    return Cut(name, dest, dim, tp_rank * local, local)


def row_cut(name: str, dest: str, dim: int, local: int, tp_rank: int) -> Cut:
    """A row-parallel weight: `local` input columns per rank, rank r's at r * local."""
    return Cut(name, dest, dim, tp_rank * local, local)


def qkv_cut(name: str, dest: str, dim: int, shard: str, *, heads: int, kv_heads: int, head_size: int,
            v_head_size: int, kv_replicas: int, tp_rank: int) -> Cut:
    """One of q, k, v in a fused QKV parameter: `heads`/`kv_heads` are this rank's head counts (vLLM's
    QKVParallelLinear.num_heads/num_kv_heads); with fewer key/value heads than ranks each is replicated on
    `kv_replicas` consecutive ranks (rank r holds head r // kv_replicas). Local layout: q, then k, then v."""
    sizes = {"q": heads * head_size, "k": kv_heads * head_size, "v": kv_heads * v_head_size}
    offsets = {"q": 0, "k": sizes["q"], "v": sizes["q"] + sizes["k"]}
    owner = tp_rank if shard == "q" else tp_rank // kv_replicas
    return Cut(name, dest, dim, owner * sizes[shard], sizes[shard], offsets[shard])


def merged_cut(name: str, dest: str, dim: int, index: int, *, output_sizes: list[int], tp_size: int,
               tp_rank: int) -> Cut:
    """Part `index` of a merged column-parallel parameter (gate then up): each part split over the ranks and
    this rank's pieces laid side by side."""
    local = [size // tp_size for size in output_sizes]
    return Cut(name, dest, dim, tp_rank * local[index], local[index], sum(local[:index]))


def vocab_cut(name: str, dest: str, dim: int, *, start: int, end: int, padded: int) -> Cut:
    """A vocabulary-parallel embedding or LM head: this rank's rows `[start, end)` of the original vocabulary
    (vLLM's `shard_indices.org_vocab_start/end_index`), written at row 0 of its `padded` rows, the rest zeroed."""
    return Cut(name, dest, dim, start, end - start, 0, padded)


def whole(name: str, dest: str) -> Cut:
    """A weight every engine rank keeps whole."""
    return Cut(name, dest)


@dataclass
class SlicePlan:
    """Every trainer tensor's cut for one engine rank, and the bucket the trainer fills before handing slices over."""

    cuts: dict[str, Cut]
    tp_size: int
    tp_rank: int
    bucket_bytes: int


@dataclass
class SliceStats:
    """What one sync moved on this rank: bytes of slices (`sharded_bytes` of the cut weights, and their whole
    size `sharded_full_bytes`), the largest bucket, and how many weights were gathered whole to be narrowed."""

    bytes: int = 0
    sharded_bytes: int = 0
    sharded_full_bytes: int = 0
    peak_bucket_bytes: int = 0
    gathered: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {"perf/update_weights_mb": self.bytes / 2**20, "perf/update_weights_bucket_peak_mb":
                self.peak_bucket_bytes / 2**20, "perf/update_weights_gathered_whole": float(len(self.gathered))}
