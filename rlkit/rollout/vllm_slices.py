"""The engine side of the sliced weight sync: read each weight's layout from vLLM's layers, write slices into them.

Both functions run inside the vLLM worker (`llm.collective_rpc`, in this process: the hybrid engine). The layout
is read from vLLM's own objects, no per-family table: the model's `hf_to_vllm_mapper` names the fused parameter and
shard of each HF tensor (q/k/v -> `qkv_proj` "q"/"k"/"v", gate/up -> `gate_up_proj` 0/1), the layer's class and
attributes give the split (`QKVParallelLinear.num_heads/num_kv_heads/head_size`, `MergedColumnParallelLinear.
output_sizes`, the parameter's `output_dim`/`input_dim`, `VocabParallelEmbedding.shard_indices`); any other layer's
parameter must have the HF tensor's shape and is written whole. A name that does not resolve this way (an MoE's
experts, a model without `hf_to_vllm_mapper`, added LoRA vocabulary) makes `read_cuts` return the reason, and the
engine keeps the full-tensor path (`reload_weights`, where vLLM's weight loaders narrow each full tensor).

Writing goes through vLLM's own in-place reload machinery (`initialize_layerwise_reload` ... `finalize_layerwise_
reload`, what `reload_weights` runs): a layer is rebuilt in its checkpoint layout, filled, then
`process_weights_after_loading` runs as after any load: on CPU that packs each linear layer's weight again into
its oneDNN/sgl operand (vLLM leaves the parameter itself empty), so the engine computes with the new weights.
Only the loader differs: each parameter's `weight_loader` is swapped, for the sync, for `_write_region`, which
copies a slice into its region instead of narrowing a full tensor, and put back afterwards.

vLLM 0.32's own sharded weight transfer (vllm/distributed/weight_transfer: `sharded_rdt`, `nccl_m2n`) is created by
`Worker.load_model` from a `weight_transfer_config`, but moves bytes over NCCL, CUDA IPC or Ray RDT/NIXL (none on
CPU), and its standalone destination planner (`m2n_layout.resolve_parameter_destinations`) sends fused `qkv_proj`/
`gate_up_proj` (most of a decoder's bytes) down its full-tensor fallback; so rlkit plans the cuts itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rlkit.rollout.slice_plan import Cut, column_cut, merged_cut, qkv_cut, row_cut, vocab_cut, whole


def _model(worker: Any) -> torch.nn.Module:
    return worker.model_runner.get_model()


def _recorded(layer: torch.nn.Module, param_name: str) -> torch.Tensor | None:
    """The parameter as vLLM recorded it at load (its checkpoint layout and loader attributes): on CPU the live
    linear weight is an empty placeholder once packed."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    info = LAYERWISE_INFO.get(layer)
    meta = info.restore_metadata[0].get(param_name) if info is not None else None
    return meta if meta is not None else getattr(layer, param_name, None)


def _qkv(name: str, dest: str, param: torch.Tensor, layer: Any, shard: Any) -> Cut | None:
    if shard not in ("q", "k", "v") or getattr(param, "output_dim", None) is None:
        return None
    return qkv_cut(name, dest, param.output_dim, shard, heads=layer.num_heads, kv_heads=layer.num_kv_heads,
                   head_size=layer.head_size, v_head_size=getattr(layer, "v_head_size", layer.head_size),
                   kv_replicas=layer.num_kv_head_replicas, tp_rank=layer.tp_rank)


def _merged(name: str, dest: str, param: torch.Tensor, layer: Any, shard: Any) -> Cut | None:
    if not isinstance(shard, int) or getattr(param, "output_dim", None) is None:
        return None
    return merged_cut(name, dest, param.output_dim, shard, output_sizes=list(layer.output_sizes),
                      tp_size=layer.tp_size, tp_rank=layer.tp_rank)


def _column(name: str, dest: str, param: torch.Tensor, layer: Any, shard: Any) -> Cut | None:
    dim = getattr(param, "output_dim", None)
    if shard is not None:
        return None
    return column_cut(name, dest, dim, param.shape[dim], layer.tp_rank) if dim is not None else whole(name, dest)


def _row(name: str, dest: str, param: torch.Tensor, layer: Any, shard: Any) -> Cut | None:
    dim = getattr(param, "input_dim", None)
    if shard is not None:
        return None
    return row_cut(name, dest, dim, param.shape[dim], layer.tp_rank) if dim is not None else whole(name, dest)


def _vocab(name: str, dest: str, param: torch.Tensor, layer: Any, shard: Any) -> Cut | None:
    idx = layer.shard_indices
    if shard is not None or idx.num_added_elements or getattr(param, "output_dim", None) is None:
        return None  # added vocabulary rows (LoRA's) are not the trainer's tensor
    return vocab_cut(name, dest, param.output_dim, start=idx.org_vocab_start_index, end=idx.org_vocab_end_index,
                     padded=param.shape[param.output_dim])


def _readers() -> dict[type, Any]:
    """vLLM's parallel layer classes -> the reader of their split (a subclass inherits the nearest one)."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    return {QKVParallelLinear: _qkv, MergedColumnParallelLinear: _merged, ColumnParallelLinear: _column,
            RowParallelLinear: _row, VocabParallelEmbedding: _vocab}


def _cut_of(model: torch.nn.Module, readers: Mapping[type, Any], name: str, shape: tuple[int, ...]
            ) -> Cut | str:
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None:
        return f"{type(model).__name__} has no hf_to_vllm_mapper"
    mapped = mapper._map_name_with_shard(name)  # vLLM's own HF -> engine name and shard (pinned vLLM 0.32)
    if mapped is None:
        return f"vLLM drops {name}"
    dest, shard = mapped
    module_name, _, param_name = dest.rpartition(".")
    try:
        layer = model.get_submodule(module_name)
    except AttributeError:
        return f"{name} -> {dest}: no such engine module"
    param = _recorded(layer, param_name)
    if param is None:
        return f"{name} -> {dest}: no such engine parameter"
    reader = next((readers[c] for c in type(layer).__mro__ if c in readers), None)
    if reader is None:  # a layer vLLM keeps whole on every rank
        ok = shard is None and tuple(param.shape) == shape
        return whole(name, dest) if ok else f"{name} -> {dest}: {type(layer).__name__} of shape {tuple(param.shape)}"
    cut = reader(name, dest, param, layer, shard)
    if cut is None:
        return f"{name} -> {dest} (shard {shard}): a {type(layer).__name__} layout rlkit does not cut"
    return cut if _fits(cut, shape, tuple(param.shape)) else \
        f"{name} {shape} -> {dest} {tuple(param.shape)}: the slice does not fit ({cut})"


def _fits(cut: Cut, shape: tuple[int, ...], dest: tuple[int, ...]) -> bool:
    """The slice lies inside the HF tensor, its region inside the engine parameter, the other dimensions equal."""
    if cut.dim is None:
        return shape == dest
    same = all(a == b for d, (a, b) in enumerate(zip(shape, dest)) if d != cut.dim) and len(shape) == len(dest)
    return same and cut.start + cut.length <= shape[cut.dim] and cut.dest_start + cut.length <= dest[cut.dim]


def read_cuts(worker: Any, shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Cut], int, int] | str:
    """Run in the vLLM worker: each HF tensor's cut for this engine rank, with the engine's TP size and rank; or
    the first reason one tensor cannot be cut, or an engine parameter no tensor fills (the engine then keeps the
    full-tensor path)."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    model, readers = _model(worker), _readers()
    cuts: dict[str, Cut] = {}
    for name, shape in shapes.items():
        cut = _cut_of(model, readers, name, tuple(shape))
        if isinstance(cut, str):
            return cut
        cuts[name] = cut
    # tied weights: every layer holding the tensor is written (each packs its own CPU operand from it)
    unfilled = sorted({n for n, _ in model.named_parameters(remove_duplicate=False)} - {c.dest for c in cuts.values()})
    if unfilled:
        return f"no trainer tensor fills the engine's {', '.join(unfilled[:3])}"
    return cuts, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()


def _write_region(param: torch.Tensor, loaded_weight: torch.Tensor, dim: int | None, start: int, pad_to: int
                  ) -> None:
    """The sync's weight loader: `loaded_weight` is already this rank's slice; copy it into its region."""
    if dim is None:
        assert param.shape == loaded_weight.shape, (param.shape, loaded_weight.shape)
        param.data.copy_(loaded_weight)
        return
    length = loaded_weight.shape[dim]
    param.data.narrow(dim, start, length).copy_(loaded_weight)
    if pad_to > start + length:  # a padded vocabulary's rows past the real ones
        param.data.narrow(dim, start + length, pad_to - start - length).zero_()


def write_slices(worker: Any, slices: Iterable[Iterable[tuple[Cut, torch.Tensor]]]) -> int:
    """Run in the vLLM worker: write every bucket's slices into the engine's parameters (vLLM's in-place layerwise
    reload, see the module docstring); returns the bytes written. Each bucket is dropped once written."""
    from vllm.model_executor.model_loader.reload.layerwise import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
        make_online_process_loader,
    )

    model = _model(worker)
    initialize_layerwise_reload(model)
    swapped: dict[int, tuple[torch.Tensor, Any]] = {}
    nbytes = 0
    try:
        for bucket in slices:
            for cut, piece in bucket:
                module_name, _, param_name = cut.dest.rpartition(".")
                layer = model.get_submodule(module_name)
                param = getattr(layer, param_name)
                if id(param) not in swapped:
                    swapped[id(param)] = (param, param.weight_loader)
                    param.weight_loader = _write_region
                    param.weight_loader = make_online_process_loader(layer, param_name)
                param.weight_loader(param, piece, cut.dim, cut.dest_start, cut.pad_to)
                nbytes += piece.numel() * piece.element_size()
    finally:
        finalize_layerwise_reload(model, worker.model_runner.model_config)
        for param, loader in swapped.values():  # vLLM's loaders back for the next full-tensor reload
            param.weight_loader = loader
    return nbytes
