"""An HF model sharded with FSDP2 (`fully_shard`): build, forward log-probs/values, optimizer, gather, checkpoint.

One implementation serves the actor, the frozen reference and the critic; the
roles differ only in whether an optimizer exists and which head is on top.
With LoRA (`lora=` the model section, rlkit/models/lora.py) the adapter is injected before
sharding, the base is frozen (stored in the compute dtype: bf16 on GPU, the adapter in float32),
the optimizer and the checkpoints hold the adapter only, and the weights streamed to the rollout
engine are the base's HF names with the adapter merged in.
A single worker keeps the plain module (`self.sharded` is False; in bf16 it computes on a copy cast once per
optimizer step, rlkit/workers/compute_copy.py): same API, same checkpoints (DCP reshards them for any later
world size).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.errors import UserError
from rlkit.models.config_overrides import apply_config_overrides
from rlkit.models.lora import LoraModel, lora_enabled, merged_named_tensors, wrap_lora, write_lora_info
from rlkit.models.moe_router import RouterTap
from rlkit.models.vision import (
    freeze_vision_tower,
    is_vision_model,
    text_embeddings_sliced,
    vision_tower,
)
from rlkit.utils.cpu_precision import auto_cpu_dtype
from rlkit.utils.lr_schedule import lr_lambda
from rlkit.utils.optimizer import build_optimizer
from rlkit.workers import expert_parallel, layer_compile, tp_plans, ulysses
from rlkit.workers.compute_copy import ComputeCopy
from rlkit.workers.expert_parallel import ExpertParallel
from rlkit.workers.heads import ForwardOut, Head, HeadCall, make_head
from rlkit.workers.hf_export import export_hf, export_lora  # noqa: F401  (re-exported: callers import them here)
from rlkit.workers.master_dither import dither_masters
from rlkit.workers.model_inputs import ModelInputs, TokenInput
from rlkit.workers.model_load import Rank0Weights, load_model, on_meta, rank0_load_wanted
from rlkit.workers.packing import pack_mask, trim_left_padding  # noqa: F401  (trim_left_padding: re-exported)
from rlkit.workers.parallel_layout import ParallelLayout
from rlkit.workers.shape_buckets import token_bucket
from rlkit.workers.tensor_parallel import TensorParallel
from rlkit.workers.tensor_parallel import clip_grad_norm as tp_clip_grad_norm
from rlkit.workers.varlen_attention import enable as enable_varlen
from rlkit.workers.varlen_attention import packed_kwargs

log = logging.getLogger(__name__)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` = bf16 on GPU (fast, the field's default); on CPU bf16 only where this CPU's bf16 matmul is
    measurably faster (AMX / AVX512-BF16), else fp32 (rlkit/utils/cpu_precision.py, measured once per machine).
    bf16 compute keeps fp32 master weights and optimizer state (FSDP2's MixedPrecisionPolicy below)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else auto_cpu_dtype()
    return DTYPES[name]


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks, each its own FSDP unit (so only one is gathered at a time); a
    vision-language model's are its language model's and its vision tower's."""
    out: list[torch.nn.Module] = []
    for attr in ("model", "transformer", "gpt_neox", "backbone"):
        inner = getattr(model, attr, None)
        tower = vision_tower(model)
        parts = (inner, getattr(inner, "language_model", None), getattr(inner, "text_model", None), tower,
                 getattr(tower, "encoder", None))
        for part in parts:
            for name in ("layers", "h", "blocks"):
                layers = getattr(part, name, None) if part is not None else None
                if isinstance(layers, torch.nn.ModuleList):
                    out.extend(layers)
                    break
        if out:
            return out
    return out


class FSDPModel:
    """A causal LM (or a value model) wrapped with FSDP2, built in four steps — load, adapt, place, head — the
    placing by the role's `ParallelLayout` (rlkit/workers/parallel_layout.py: FSDP2 over the default process
    group or a hybrid-sharding mesh with `fsdp_config.fsdp_size`, Ulysses groups, a tensor-parallel plan with
    `fsdp_config.tensor_parallel_size`, an expert-parallel plan with `fsdp_config.expert_parallel_size`)."""

    def __init__(
        self,
        model_path: str,
        fsdp: FSDPConfig,
        device: torch.device,
        *,
        value_head: bool = False,
        gradient_checkpointing: bool = False,
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False, config_overrides: dict | None = None,  # verl's model.override_config
        lora: Any = None,  # the model section (actor_rollout_ref.model): its lora_* keys turn LoRA on
        auto_class: str | None = None,
        ulysses_sequence_parallel_size: int = 1,
        compile_layers: bool | str = False,
        fused_lm_head: bool = False,
        freeze_vision: bool = False,
    ) -> None:
        """`auto_class`: a transformers Auto class name to load instead (the reward model's
        `AutoModelForSequenceClassification`); it gets the same wrapping, not `forward`'s heads.
        `ulysses_sequence_parallel_size` > 1: groups of that many consecutive ranks split each packed row
        along the sequence (rlkit/workers/ulysses.py); the caller gives the ranks of a group the same rows.
        `compile_layers`: torch.compile each decoder layer; "auto": by the model size (rlkit/workers/layer_compile.py).
        `fused_lm_head`: the policy's log-probs from the fused chunked LM head (rlkit/workers/heads.py).
        `freeze_vision`: a vision-language model's image encoder is not trained (verl's freeze_vision_tower)."""
        from transformers import AutoConfig

        self.device = device
        self.value_head = value_head
        self.param_dtype = resolve_dtype(fsdp.param_dtype, device)
        self.token_bucket = token_bucket(device, self.param_dtype)  # few matmul shapes (rlkit/workers/shape_buckets.py)
        self.layout = ParallelLayout.of(fsdp.fsdp_size, ulysses_sequence_parallel_size, tp=fsdp.tensor_parallel_size,
                                        ep=fsdp.expert_parallel_size)
        config = apply_config_overrides(  # verl's model.override_config, before the weights load
            AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code), config_overrides)
        use_lora = lora is not None and lora_enabled(lora) and not value_head
        if use_lora and self.layout.ep > 1:  # the config checks refuse it by key; this guards direct use
            raise UserError("fsdp_config.expert_parallel_size > 1 with LoRA: peft's adapters on the fused experts are "
                            "not split over the expert-parallel group; use expert_parallel_size=1 with LoRA")
        # rank 0 reads, the others build on meta (model_load.py); a TP or EP plan splits weights every rank has read
        rank0 = rank0_load_wanted(device, self.layout.world) and self.layout.tp == 1 and self.layout.ep == 1
        # 1. load: a frozen LoRA base needs no float32 master copy: store it in the compute dtype
        model = load_model(model_path, config, auto_class, value_head, rank0, attn_implementation=attn_implementation,
                           dtype=self.param_dtype if use_lora else torch.float32, trust_remote_code=trust_remote_code)
        self.varlen_reason = enable_varlen(model)  # None: packed rows attend per sequence without a mask
        if self.varlen_reason is not None:
            log.info("remove-padding packs with a block-diagonal mask: %s", self.varlen_reason)
            if self.layout.sp > 1:
                raise ValueError(f"ulysses_sequence_parallel_size > 1 needs the varlen attention: {self.varlen_reason}")
        self.sp = self.layout.sequence_parallel(config)
        # 2. adapt: frozen parts, checkpointing, LoRA, compiled layers, dithered masters
        self._adapt(model, fsdp, lora if use_lora else None, gradient_checkpointing, compile_layers, freeze_vision)
        # 3. place: shard (or keep, or copy for compute) along the layout, then onto the device
        self._place(model, fsdp, gradient_checkpointing, Rank0Weights(model) if rank0 else None)
        self.module = model
        # 4. head: the router taps of an MoE, the log-prob or value head on top (in `forward`)
        self.router_tap = RouterTap.attach(model)  # MoE: router hooks (aux loss, load metrics, replay); None if dense
        if self.router_tap is not None and self.tp is not None:  # the group's rows: each rank's tokens kept apart
            self.router_tap.share_rows(self.tp.size, self.tp.rank)
        logits_to_keep = "logits_to_keep" in inspect.signature(type(model).forward).parameters
        self.head = make_head(value_head, fused_lm_head, logits_to_keep, self.tp.vocab if self.tp else None)
        # model inputs that are not the model's keywords, by name -> who takes them (MoE: the replayed routes)
        self._input_consumers = self.router_tap.inputs() if self.router_tap is not None else {}
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None

    def _adapt(self, model: torch.nn.Module, fsdp: FSDPConfig, lora: Any, gradient_checkpointing: bool,
               compile_layers: bool | str, freeze_vision: bool) -> None:
        """What is trained and how the loaded model runs, before it is placed (`lora`: the model section when
        LoRA is on)."""
        if freeze_vision:
            log.info("vision tower frozen: %d parameters", freeze_vision_tower(model))
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.config = model.config
        self.lora: LoraModel | None = wrap_lora(model, lora, adapter_dtype=torch.float32) if lora is not None else None
        self._lora_scalings = self.lora.scalings() if self.lora is not None else {}
        if layer_compile.wanted(compile_layers, model):
            layer_compile.compile_layers(_decoder_layers(model))
        # meta ranks of the rank-0 load skip it: they receive rank 0's dithered masters (the same seed's)
        if fsdp.dither_master_weights and lora is None and self.param_dtype != torch.float32 and not on_meta(model):
            moved = dither_masters(model.parameters(), self.param_dtype)
            log.info("%s compute: %.1f%% of the fp32 masters dithered off the grid", self.param_dtype, 100 * moved)

    def _place(self, model: torch.nn.Module, fsdp: FSDPConfig, gradient_checkpointing: bool,
               from_rank0: Rank0Weights | None) -> None:
        """The tensor-parallel plan on the layout's `tp` dimension (rlkit/workers/tp_plans.py), then FSDP2 on its
        data-parallel dimensions (each decoder layer a unit), with mixed precision and offload; one worker keeps the
        plain module; then the weights onto the device (rank 0's, broadcast, for a rank-0 load)."""
        offload = CPUOffloadPolicy() if (fsdp.param_offload and self.device.type == "cuda") else None
        self.tp: TensorParallel | None = None  # the TP group (its rows, the LM head's vocabulary slice)
        self.ep: ExpertParallel | None = None  # the EP group and the experts placed over it
        self.params_offloaded = offload is not None  # FSDP2 keeps them (and grads) on the host, steps them there
        # one worker: FSDP2 would only add copies and hooks. In bf16 a compute copy casts once per optimizer step
        # (rlkit/workers/compute_copy.py); gradient checkpointing recomputes outside `computing()`, so FSDP2 there
        self.sharded = (fsdp.shard_single_worker or self.layout.world > 1 or offload is not None
                        or (self.param_dtype != torch.float32 and gradient_checkpointing))
        self.compute_copy = (ComputeCopy(model, self.param_dtype)
                             if not self.sharded and self.param_dtype != torch.float32 else None)
        if self.sharded:
            shard_kwargs: dict[str, Any] = {
                "mp_policy": MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=DTYPES[fsdp.reduce_dtype])}
            if offload is not None:
                shard_kwargs["offload_policy"] = offload
            meshes = self.layout.meshes(self.device)
            if meshes.tp is not None:
                self.tp = tp_plans.parallelize(model, meshes.tp, fsdp.sequence_parallel)
                if self.tp.sequence_parallel:  # every fed length splits evenly along the sequence
                    self.token_bucket = math.lcm(self.token_bucket, self.tp.size)
            if meshes.ep is not None:
                self.ep = expert_parallel.parallelize(model, meshes.ep)
                for experts in self.ep.modules:  # their own unit, over the ranks holding the same experts
                    fully_shard(experts, **dict(shard_kwargs, mesh=meshes.experts_fsdp))
                    # the no-EP mean over all data-parallel ranks (expert_parallel.py's docstring); gloo has no
                    # pre-scaled sum (NCCL's PREMUL_SUM): a plain sum, then the divide (not over one rank: torch
                    # 2.13's FSDP2 would divide that twice; it calls no reduce-scatter there)
                    experts.set_gradient_divide_factor(float(self.layout.replicate * self.layout.shard))
                    experts.set_force_sum_reduction_for_comms(self.device.type == "cpu"
                                                              and self.layout.shard // self.layout.ep > 1)
            if meshes.fsdp is not None:
                shard_kwargs["mesh"] = meshes.fsdp
            for layer in _decoder_layers(model):
                fully_shard(layer, **shard_kwargs)
            fully_shard(model, **shard_kwargs)
        if from_rank0 is not None:
            from_rank0.place(model, self.device, offload is not None)
            from_rank0.fill(model)
        elif offload is None:
            model.to(self.device)

    # ------------------------------------------------------------ training
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps: every parameter, or the adapter's alone with LoRA."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def setup_optimizer(self, optim: OptimConfig, total_steps: int) -> None:
        if self.compute_copy is not None:
            self.compute_copy.replace_frozen = False  # a frozen part (vision tower) stays as checkpoints hold it
        self.optimizer = build_optimizer(self.trainable_parameters(), optim)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(optim, total_steps))

    def offload_optimizer(self) -> None:
        """Move optimizer state to host memory between updates (frees device memory for the rollout engine)."""
        self._move_optimizer(torch.device("cpu"))

    def load_optimizer(self) -> None:
        self._move_optimizer(self.device)

    def _move_optimizer(self, device: torch.device) -> None:
        if self.optimizer is None or self.device.type == "cpu" or self.params_offloaded:
            return  # on CPU, or with offloaded parameters (stepped on the host), the state stays in host memory
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu":
            torch.cuda.empty_cache()

    def clip_and_step(self, max_norm: float) -> float:
        """Clip the global grad norm, step if finite; returns the norm (nan/inf = step skipped)."""
        assert self.optimizer is not None
        if self.tp is not None or self.ep is not None:  # parameters on several meshes: one norm per mesh, combined
            norm = tp_clip_grad_norm(self.trainable_parameters(), max_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm_f = float(norm)
        if math.isfinite(norm_f):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.compute_copy is not None:
            self.compute_copy.release()  # stale now; the next forward casts the stepped masters
        return norm_f

    def computing(self) -> contextlib.AbstractContextManager:
        """Around a direct call of `self.module` (outside `forward`): the parameters in the compute dtype, as
        FSDP2 gathers them inside its forward (a single bf16 worker's compute copy; nothing otherwise)."""
        return self.compute_copy.active() if self.compute_copy is not None else contextlib.nullcontext()

    # ------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor | ModelInputs,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        response_length: int | None = None,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        remove_padding: bool = True,
        chunk_size: int = 1024,
        response_logits_only: bool = True,
        fused_lm_head: bool | None = None,
        routed_experts: torch.Tensor | None = None,
        with_sum_pi_squared: bool = False,
        loss_mask: torch.Tensor | None = None,
    ) -> ForwardOut:
        """Log-probs (and entropy) of the response tokens, or values when this is a critic (the head chosen at
        construction, rlkit/workers/heads.py).

        Inputs: `forward(inputs, response_length=R)` with a `ModelInputs` (rlkit/workers/model_inputs.py: the
        (b, S) rows and their per-token extras), or the (b, S) tensors, with `routed_experts` (b, S, layers, k):
        MoE routing replay (issue 18), the experts each token must use (-1 = its own), for the router tap.
        `remove_padding` packs the valid tokens into one row (rlkit/workers/packing.py) whose sequences
        attend only to themselves (varlen attention, no (T x T) mask; models it cannot serve get the
        block-diagonal mask); with sequence parallelism the row is always packed and split over the group.
        Otherwise the leading columns no row uses are trimmed. Every per-token extra follows the tokens.
        `response_logits_only` runs the LM head only where a response token is predicted (the
        model's `logits_to_keep`), so no (rows x length x vocab) logits exist for prompt or pad
        positions; other response positions get log-prob 0 (they are masked by `response_mask`).
        `fused_lm_head` (with `response_logits_only`; None = the constructor's choice) computes them from the
        hidden states in chunks without keeping the logits for backward (rlkit/workers/fused_lm_head.py).
        `with_sum_pi_squared` adds sum_v pi_v^2 per response token (float32, the same tempered distribution as the
        log-probs; chunk by chunk on either head), for the optimal token baseline estimators.
        """
        if isinstance(input_ids, ModelInputs):
            if attention_mask is not None or position_ids is not None or routed_experts is not None:
                raise TypeError("forward(ModelInputs, ...): the mask, positions and routes belong in the ModelInputs")
            inputs = input_ids
        elif attention_mask is None or position_ids is None:
            raise TypeError("forward(input_ids, attention_mask, position_ids, response_length) or forward(ModelInputs)")
        else:
            inputs = ModelInputs.of(input_ids, attention_mask, position_ids, routed_experts)
        if response_length is None:
            raise TypeError("forward() needs response_length")
        inputs = inputs.to(self.device)
        head = self.head if fused_lm_head is None else self.head.with_fused(fused_lm_head)
        call = HeadCall(response_length, temperature, with_entropy, chunk_size, response_logits_only,
                        with_sum_pi_squared, self.token_bucket, loss_mask)
        vision = self.config if is_vision_model(self.config) else None
        if self.sp is not None or self.tp is not None:  # rows gathered over the group: `loss_mask` is this rank's
            call = dataclasses.replace(call, wanted=None)
        if self.sp is not None:  # the group's micro-batches together, packed and split along the sequence
            inputs, own = inputs.gather_rows(self.sp, vision)
            return self._packed_forward(inputs, head, call).rows(own)
        if self.tp is not None:  # the group's micro-batches together through the split weights; each keeps its own
            if self.router_tap is not None:  # whose tokens the routers see (moe_router.py: RouterTap.share_rows)
                inputs = inputs.with_extra(RouterTap.OWNERS, TokenInput(
                    torch.full_like(inputs.input_ids, self.tp.rank), fill=-1, to_model=False))
            inputs, own = inputs.gather_rows(self.tp, vision)
            out = self._rows_forward(inputs, head, call, remove_padding)
            return out.map(lambda t: self.tp.own_rows(t, own))
        return self._rows_forward(inputs, head, call, remove_padding)

    def _rows_forward(self, inputs: ModelInputs, head: Head, call: HeadCall, remove_padding: bool) -> ForwardOut:
        """The rows packed into one, or trimmed of their common left padding."""
        if remove_padding:
            return self._packed_forward(inputs, head, call)
        rows = inputs.trim_left_padding(call.response_length, self.token_bucket)
        kwargs = self._model_kwargs(
            rows.extras, input_ids=rows.input_ids, attention_mask=rows.attention_mask, position_ids=rows.position_ids,
            **rows.images,
        )
        with self.computing():
            return head.padded(self.module, kwargs, rows, call)

    def _packed_forward(self, inputs: ModelInputs, head: Head, call: HeadCall) -> ForwardOut:
        """The packed row, or under SP this rank's slice of it; outputs gathered back to (b, R)."""
        packed = inputs.pack(self.sp, self.token_bucket)
        # under SP with images the model merges the image features into the whole row, and its language model reads
        # this rank's slice of the merged embeddings (an image's tokens may lie in several ranks' slices)
        whole_row = self.sp is not None and bool(inputs.images)
        kwargs = self._model_kwargs(packed.extras, input_ids=packed.row.input_ids if whole_row else packed.input_ids,
                                    position_ids=packed.position_ids, **inputs.images)
        if self.varlen_reason is None:
            kwargs.update(packed_kwargs(packed.row.cu_seqlens, packed.row.max_len))
            if self.sp is not None:
                kwargs[ulysses.GROUP_KWARG] = self.sp.group
        else:
            kwargs["attention_mask"] = pack_mask(inputs.attention_mask, self.param_dtype)
        sliced = text_embeddings_sliced(self.module, packed.lo, packed.hi) if whole_row else contextlib.nullcontext()
        with sliced, self.computing():
            return head.packed(self.module, kwargs, inputs, packed, call)

    def _model_kwargs(self, extras: dict[str, TokenInput], **kwargs: Any) -> dict[str, Any]:
        """The model's forward keywords; extras that are not model keywords go to their consumers (the router
        tap's replayed routes) before the forward."""
        for name, extra in extras.items():
            if extra.to_model:
                kwargs[name] = extra.value
            elif name in self._input_consumers:
                self._input_consumers[name](extra.value)
            else:
                raise ValueError(f"{name} given to a model that has nothing consuming it (a dense model: no routers)")
        if self.compute_copy is not None:  # FSDP2 casts the root's floating inputs (pixel values) to param_dtype
            kwargs = {k: self.compute_copy.cast_inputs(v) for k, v in kwargs.items()}
        return dict(kwargs, use_cache=False)

    # ------------------------------------------------------- weights out
    def iter_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (HF name, full tensor) one parameter at a time; every rank must iterate (collective).
        With LoRA: the base model's names, the adapter merged into each adapted weight."""
        if self.lora is not None:
            yield from merged_named_tensors(self.iter_wrapped_params(), self._lora_scalings)
            return
        yield from self.iter_wrapped_params()

    def iter_wrapped_params(self, adapter_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of the module as it is (with LoRA: `.base_layer` names + adapter tensors;
        `adapter_only`: the adapter's alone). A collective, as `iter_full_params`."""
        for name, tensor in self.module.state_dict().items():
            if adapter_only and ".lora_" not in name:
                continue
            if hasattr(tensor, "full_tensor"):
                tensor = self._on_device(tensor).full_tensor()
            yield name, tensor.detach()

    def iter_engine_slices(self, plan: Any, stats: Any) -> Iterator[list[tuple[Any, torch.Tensor]]]:
        """Buckets of this rank's slices for a tensor-parallel engine (`plan`: rlkit.rollout.slice_plan.SlicePlan;
        `stats`: a SliceStats filled as they go; rlkit/workers/engine_slices.py). A collective, as
        `iter_full_params`; without LoRA (its merged weights take the full-tensor path)."""
        from rlkit.workers.engine_slices import engine_slices

        state = self.module.state_dict()
        named = ((n, self._on_device(t) if hasattr(t, "full_tensor") else t) for n, t in state.items())
        yield from engine_slices(named, plan, stats)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each state-dict tensor's whole shape (no collective): what the engine plans its cuts from."""
        return {n: tuple(t.shape) for n, t in self.module.state_dict().items()}

    def _on_device(self, shard: Any) -> Any:
        """A CPU-offloaded DTensor shard moved to the device first, so the gather runs on NCCL, not over gloo."""
        if shard.device.type == self.device.type:
            return shard
        return DTensor.from_local(shard.to_local().to(self.device, non_blocking=True), shard.device_mesh,
                                  shard.placements, shape=shard.shape, stride=shard.stride())

    def memory_report(self) -> dict[str, float]:
        """Parameters (all / trained), this rank's optimizer-state and gradient bytes (the run summary)."""

        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if hasattr(t, "to_local") else t

        params, trainable = list(self.module.parameters()), self.trainable_parameters()
        state_bytes = 0
        for state in self.optimizer.state.values() if self.optimizer is not None else []:
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    state_bytes += local(value).numel() * local(value).element_size()
        return {
            "params": float(sum(p.numel() for p in params)),
            "trainable_params": float(sum(p.numel() for p in trainable)),
            "optimizer_state_mb": state_bytes / 2**20,
            "grad_mb": sum(local(p).numel() * local(p).element_size() for p in trainable) / 2**20,
            "lora_rank": float(self.lora.config.r) if self.lora is not None else 0.0,
        }

    def full_state_dict(self, to_cpu: bool = True) -> dict[str, torch.Tensor]:
        return {k: (v.cpu() if to_cpu else v) for k, v in self.iter_full_params()}

    # ------------------------------------------------------- checkpoints
    def save(self, path: Path, with_optimizer: bool = True, with_scheduler: bool = True) -> None:
        """Sharded save with torch.distributed.checkpoint (each rank writes its shards)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = {"model": self._model_state()}
        if with_optimizer and self.optimizer is not None:
            state["optim"] = get_optimizer_state_dict(self.module, self.optimizer)
        dcp.save(state, checkpoint_id=str(path))
        if not dist.is_initialized() or dist.get_rank() == 0:
            self.config.save_pretrained(path / "hf_config")
            if self.lora is not None:  # what export needs to rebuild the adapter on the base
                write_lora_info(path, self.lora.info(self.config.name_or_path))
            if with_scheduler and self.scheduler is not None:
                torch.save(self.scheduler.state_dict(), path / "scheduler.pt")

    def _state_options(self):
        """With LoRA the checkpoint holds the trained (adapter) tensors only: the base is the model folder."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=True, strict=False) if self.lora is not None else None

    def _model_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.module, options=self._state_options())
        if self.lora is not None:  # a tied (frozen) LM head still shows up: keep the adapter's tensors only
            state = {k: v for k, v in state.items() if ".lora_" in k}
        return state

    def load(self, path: Path, with_optimizer: bool = True, with_scheduler: bool = True) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        state = {"model": self._model_state()}
        if with_optimizer and self.optimizer is not None:
            state["optim"] = get_optimizer_state_dict(self.module, self.optimizer)
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(self.module, state["model"], options=self._state_options())
        if "optim" in state:
            set_optimizer_state_dict(self.module, self.optimizer, state["optim"])
        sched = path / "scheduler.pt"
        if with_scheduler and self.scheduler is not None and sched.exists():
            self.scheduler.load_state_dict(torch.load(sched, weights_only=False))
