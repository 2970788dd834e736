"""Tensor-parallel plans per model family: which module is split how over a role's TP group (DTensor's
`parallelize_module`, torchtitan's shape), looked up by the HF config's `model_type` in `TP_PLANS`.

A plan is a function of the loaded model returning {module pattern: ParallelStyle}. The decoder families rlkit
trains share one shape (Llama, Mistral, Qwen2/2.5, Qwen3 and the Qwen2-VL/2.5-VL language model):
- q/k/v and gate/up projections column-parallel: each rank computes `heads / tp` attention heads and its share
  of the MLP's hidden units on the replicated activations (HF's attention reshapes to (.., -1, head_dim), so it
  runs on the local heads as it stands; the GQA ratio is unchanged);
- o and down projections row-parallel: the partial sums all-reduced back to replicated activations;
- Qwen3's per-head q/k norms: their one weight replicated, applied to the local heads (its gradient summed over the
  group);
- the token embedding row-parallel over the vocabulary (a token's row lives on one rank, its output summed);
- the LM head column-parallel over the vocabulary, its logits left sharded: the log-prob head reduces over the
  vocabulary shards (rlkit/workers/vocab_parallel.py) and never gathers a (tokens x vocab) tensor. Tied
  embeddings (one (V, H) weight for both) share that weight, sharded once on the vocabulary.
Norms, rotary tables and a VLM's vision tower stay whole on every rank of the group (FSDP2 still shards them
over the data-parallel ranks). With sequence parallel (`fsdp_config.sequence_parallel`, Megatron's; on by default)
the residual stream and the norms between the split projections run on 1/tp of the tokens each (`with_sequence_
parallel`): the first layer keeps its slice of the sequence, the attention and the MLP all-gather it, the o and
down projections reduce-scatter back to slices, and the final norm all-gathers for the LM head, so activation
memory outside the projections falls by tp for the same communication volume. MoE families (Qwen3-MoE, Mixtral):
the same attention, embedding and LM head, the dense-MLP layers' MLP as above; a sparse layer's router and experts
stay whole over the TP group (every rank of it runs them on the group's replicated rows; under sequence parallel
the gathered sequence, its output sliced back to this rank's tokens), and the expert-parallel dimension splits the
experts (rlkit/workers/expert_parallel.py), so TP and EP compose.

A new family: a function returning its plan, `@TP_PLANS.register("<model_type>")`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor.parallel import SequenceParallel

from rlkit.errors import UserError
from rlkit.registry import Registry
from rlkit.workers.tensor_parallel import TensorParallel, VocabShard

TPPlan = Callable[[torch.nn.Module], dict[str, Any]]
TP_PLANS: Registry[TPPlan] = Registry("tensor-parallel plan (by the model's config.model_type)")


def _text_model(model: torch.nn.Module) -> str:
    """The dotted name of the decoder stack (the module holding `embed_tokens` and `layers`): `model` for a causal
    LM or a value model, `model.language_model` for a vision-language model."""
    for name, module in model.named_modules():
        if hasattr(module, "embed_tokens") and isinstance(getattr(module, "layers", None), torch.nn.ModuleList):
            return name
    raise UserError(f"tensor parallel: {type(model).__name__} has no decoder stack (embed_tokens + layers)")


def _head_name(model: torch.nn.Module) -> str | None:
    """The LM head's dotted name (None for a value model or a classifier: their one-column head stays whole)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return next((name for name, module in model.named_modules() if module is head), None) if head is not None else None


@TP_PLANS.register("llama", "mistral", "qwen2", "qwen3", "qwen2_vl", "qwen2_5_vl")
def decoder_plan(model: torch.nn.Module) -> dict[str, Any]:
    """The Llama-shaped decoder's plan (see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    stack = _text_model(model)
    layer = f"{stack}.layers.*"
    first = model.get_submodule(stack).layers[0].self_attn
    # Qwen3's per-head q/k norms: one (head_dim,) weight over the local heads (b, s, heads / tp, head_dim); as a
    # replicated DTensor on heads-sharded input, its gradient is summed over the group's heads (a frozen one stays so)
    norms = {f"{layer}.self_attn.{name}": _NormOnSlices(sequence_dim=2, use_local_output=True)
             for name in ("q_norm", "k_norm") if hasattr(first, name)}
    plan: dict[str, Any] = {**norms,
        f"{stack}.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        f"{layer}.self_attn.q_proj": ColwiseParallel(),
        f"{layer}.self_attn.k_proj": ColwiseParallel(),
        f"{layer}.self_attn.v_proj": ColwiseParallel(),
        f"{layer}.self_attn.o_proj": RowwiseParallel(),
        f"{layer}.mlp.gate_proj": ColwiseParallel(),
        f"{layer}.mlp.up_proj": ColwiseParallel(),
        f"{layer}.mlp.down_proj": RowwiseParallel(),
    }
    head = _head_name(model)
    if head is not None:
        plan[head] = ColwiseParallel(output_layouts=Shard(-1))  # the logits stay sharded on the vocabulary
    return plan


@TP_PLANS.register("qwen3_moe", "mixtral")
def moe_decoder_plan(model: torch.nn.Module) -> dict[str, Any]:
    """A Llama-shaped MoE decoder's plan: the decoder plan's attention, embedding and head; the gated MLP of the
    layers that have one (Qwen3-MoE's `mlp_only_layers`), named one by one; routers and experts whole."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {name: style for name, style in decoder_plan(model).items() if ".mlp." not in name}
    stack = _text_model(model)
    for i, layer in enumerate(model.get_submodule(stack).layers):
        if hasattr(layer.mlp, "gate_proj") and hasattr(layer.mlp, "down_proj"):
            prefix = f"{stack}.layers.{i}.mlp"
            plan.update({f"{prefix}.gate_proj": ColwiseParallel(), f"{prefix}.up_proj": ColwiseParallel(),
                         f"{prefix}.down_proj": RowwiseParallel()})
    return plan


def with_adapters(model: torch.nn.Module, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan for a model whose projections carry LoRA adapters (peft's layers: `base_layer`, `lora_A.<name>`,
    `lora_B.<name>`), each adapter sharded with its base: a column-parallel base's B is column-parallel (A, whole,
    reads the replicated input), a row-parallel base's A is row-parallel (B, whole, reads the all-reduced rank-r
    activation), so `base(x) + B(A(x))` adds two tensors laid out alike. Without adapters: the plan as it is."""
    import re

    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleOutput, RowwiseParallel

    modules = dict(model.named_modules())
    if not any(hasattr(m, "base_layer") for m in modules.values()):
        return plan
    out: dict[str, Any] = {}
    for pattern, style in plan.items():
        regex = re.compile(r"\.".join("[^.]+" if seg == "*" else re.escape(seg) for seg in pattern.split(".")))
        for name in (n for n in modules if regex.fullmatch(n)):
            module = modules[name]
            if not hasattr(module, "base_layer"):
                out[name] = style
                continue
            if type(style) not in (ColwiseParallel, RowwiseParallel) or not isinstance(
                module.base_layer, torch.nn.Linear
            ):
                raise UserError(
                    f"LoRA with tensor parallel: the adapter on {name} (a {type(module.base_layer).__name__}"
                    ") cannot be split with its base; leave it out of target_modules"
                )
            out[f"{name}.base_layer"] = style
            for adapter in module.lora_A:
                if isinstance(style, ColwiseParallel):
                    out[f"{name}.lora_B.{adapter}"] = ColwiseParallel()
                else:
                    out[f"{name}.lora_A.{adapter}"] = RowwiseParallel()
                    if _to_sequence_slices(style):  # B's whole output sliced as the base's
                        out[f"{name}.lora_B.{adapter}"] = PrepareModuleOutput(
                            output_layouts=Replicate(), desired_output_layouts=Shard(1))
    return out


class _NormOnSlices(SequenceParallel):
    """A norm on this rank's slice of the tokens, its weight replicated over the group as a DTensor (its gradient
    summed over the group's slices). Unlike torch's `SequenceParallel`, a frozen weight (a LoRA run's norms) stays
    frozen."""

    def _replicate_module_fn(self, name: str, module: torch.nn.Module, device_mesh: Any) -> None:
        from torch.distributed.tensor import DTensor, Replicate

        for p_name, param in list(module.named_parameters(recurse=False)):
            replicated = DTensor.from_local(param, device_mesh, [Replicate()], run_check=False)
            module.register_parameter(p_name, torch.nn.Parameter(replicated, requires_grad=param.requires_grad))


class _GatheredNorm(_NormOnSlices):
    """The final norm under sequence parallel: computed on this rank's slice of the tokens, its output gathered
    whole (the log-prob head reads every token's hidden state)."""

    @staticmethod
    def _prepare_output_fn(use_local_output: bool, mod: torch.nn.Module, outputs: Any, device_mesh: Any) -> Any:
        from torch.distributed.tensor import Replicate

        return outputs.redistribute(placements=[Replicate()]).to_local()


def with_sequence_parallel(model: torch.nn.Module, plan: dict[str, Any]) -> dict[str, Any]:
    """`plan` with the residual stream split along the sequence between the split projections (Megatron's sequence
    parallel): the layer norms run on each rank's tokens (their weights replicated over the group, their gradients
    summed over it), the row-parallel o/down projections (and a LoRA B beside them) hand back sequence slices
    instead of all-reduced wholes, attention and MLP gather the sequence first. An MLP the plan does not split (an
    MoE layer's router and experts) runs whole on the gathered sequence and keeps this rank's slice of its output.
    The fed sequence length must be a multiple of tp (the forward pads it: `FSDPModel.token_bucket`)."""
    from fnmatch import fnmatch

    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleInputOutput, RowwiseParallel

    stack = _text_model(model)
    layers = model.get_submodule(stack).layers
    layer = f"{stack}.layers.*"
    out = dict(plan)
    for name, style in plan.items():
        if isinstance(style, RowwiseParallel) and name.startswith(f"{stack}.layers."):
            out[name] = RowwiseParallel(output_layouts=Shard(1))
    for norm in ("input_layernorm", "post_attention_layernorm"):
        if not all(hasattr(lay, norm) for lay in layers):
            raise UserError(f"sequence parallel: {type(layers[0]).__name__} has no {norm}; set "
                            "fsdp_config.sequence_parallel=false")
        out[f"{layer}.{norm}"] = _NormOnSlices()
    out[f"{stack}.layers.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                  use_local_output=True)
    out[f"{layer}.self_attn"] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                   desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                                   use_local_output=True)
    gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    split = [i for i in range(len(layers)) if any(
        isinstance(style, RowwiseParallel) and fnmatch(f"{stack}.layers.{i}.mlp.", name.rsplit(".", 1)[0] + ".")
        for name, style in plan.items())]
    if len(split) == len(layers):
        out[f"{layer}.mlp"] = PrepareModuleInput(**gather, use_local_output=True)
    else:  # per layer: a split MLP reduce-scatters itself; a whole one's output is sliced
        for i in range(len(layers)):
            out[f"{stack}.layers.{i}.mlp"] = (
                PrepareModuleInput(**gather, use_local_output=True) if i in split else PrepareModuleInputOutput(
                    **gather, use_local_input=True, output_layouts=Replicate(), desired_output_layouts=Shard(1)))
    out[f"{stack}.norm"] = _GatheredNorm()
    return out


def _to_sequence_slices(style: Any) -> bool:
    """A row-parallel style that hands back sequence slices (sequence parallel) rather than the all-reduced whole."""
    return any(getattr(p, "dim", None) == 1 for p in getattr(style, "output_layouts", ()) or ())


def check_heads(config: Any, tp: int) -> None:
    """Each rank attends with `heads / tp` query and key/value heads: both counts must divide by tp."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if count % tp:
            raise UserError(
                f"fsdp_config.tensor_parallel_size={tp} must divide the model's {name}={count} "
                "(each rank computes heads/tp of the attention heads)"
            )


def parallelize(model: torch.nn.Module, tp_mesh: Any, sequence_parallel: bool = True) -> TensorParallel:
    """Split `model` over `tp_mesh` (1-D) by its family's plan (with `sequence_parallel`, the residual stream split
    along the sequence too), before FSDP2 shards it over the data-parallel ranks; returns the group's handle (its
    rows, the LM head's vocabulary slice, whether the sequence is split)."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    model_type = model.config.model_type
    if model_type not in TP_PLANS:
        raise UserError(
            f"fsdp_config.tensor_parallel_size={tp}: no tensor-parallel plan for model_type "
            f"'{model_type}' (plans: {', '.join(TP_PLANS)}); use tensor_parallel_size=1"
        )
    check_heads(model.config, tp)
    embeddings, head = model.get_input_embeddings(), _head_name(model)
    tied = head is not None and model.get_submodule(head).weight is embeddings.weight
    plan = TP_PLANS.get(model_type)(model)
    if sequence_parallel:
        plan = with_sequence_parallel(model, plan)
    parallelize_module(model, tp_mesh, with_adapters(model, plan))
    vocab = None
    if head is not None:
        head_module = model.get_submodule(head)
        if tied:  # both sides were sharded alike (vocabulary rows); keep the one parameter
            head_module.weight = model.get_input_embeddings().weight
        vocab = VocabShard.of(head_module.weight)
    group = tp_mesh.get_group()
    return TensorParallel(tp, tp_mesh.get_local_rank(), group, tp_mesh, vocab, sequence_parallel)
