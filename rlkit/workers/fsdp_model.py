"""An HF model sharded with FSDP2 (`fully_shard`): build, forward log-probs/values, optimizer, gather, checkpoint.

One implementation serves the actor, the frozen reference and the critic; the
roles differ only in whether an optimizer exists and which head is on top.
With LoRA (`lora=` the model section, rlkit/models/lora.py) the adapter is injected before
sharding, the base is frozen (stored in the compute dtype: bf16 on GPU, the adapter in float32),
the optimizer and the checkpoints hold the adapter only, and the weights streamed to the rollout
engine are the base's HF names with the adapter merged in.
A single worker computing in float32 keeps the plain module (`self.sharded` is
False): same API, same checkpoints (DCP reshards them for any later world size).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.models.lora import LoraModel, lora_enabled, merged_named_tensors, wrap_lora, write_lora_info
from rlkit.models.moe_router import RouterTap
from rlkit.utils.cpu_precision import auto_cpu_dtype
from rlkit.utils.lr_schedule import lr_lambda
from rlkit.workers import layer_compile, ulysses
from rlkit.workers.hf_export import export_hf, export_lora  # noqa: F401  (re-exported: callers import them here)
from rlkit.workers.log_prob_head import FusionGate, head_log_probs
from rlkit.workers.master_dither import dither_masters
from rlkit.workers.packing import PackedRow, pack_mask, response_targets, trim_left_padding
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


@dataclass
class ForwardOut:
    log_probs: torch.Tensor | None = None  # (b, R)
    entropy: torch.Tensor | None = None  # (b, R)
    values: torch.Tensor | None = None  # (b, R)

    def rows(self, own: slice) -> ForwardOut:
        return ForwardOut(*(None if t is None else t[own] for t in (self.log_probs, self.entropy, self.values)))


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks, each its own FSDP unit (so only one is gathered at a time)."""
    for attr in ("model", "transformer", "gpt_neox", "backbone"):
        inner = getattr(model, attr, None)
        for name in ("layers", "h", "blocks"):
            layers = getattr(inner, name, None) if inner is not None else None
            if isinstance(layers, torch.nn.ModuleList):
                return list(layers)
    return []


class FSDPModel:
    """A causal LM (or a value model) wrapped with FSDP2 on the default process group."""

    def __init__(
        self,
        model_path: str,
        fsdp: FSDPConfig,
        device: torch.device,
        *,
        value_head: bool = False,
        gradient_checkpointing: bool = False,
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        lora: Any = None,  # the model section (actor_rollout_ref.model): its lora_* keys turn LoRA on
        auto_class: str | None = None,
        ulysses_sequence_parallel_size: int = 1,
        compile_layers: bool = False,
    ) -> None:
        """`auto_class`: a transformers Auto class name to load instead (the reward model's
        `AutoModelForSequenceClassification`); it gets the same wrapping, not `forward`'s heads.
        `ulysses_sequence_parallel_size` > 1: groups of that many consecutive ranks split each packed row
        along the sequence (rlkit/workers/ulysses.py); the caller gives the ranks of a group the same rows.
        `compile_layers`: torch.compile each decoder layer (rlkit/workers/layer_compile.py)."""
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

        self.device = device
        self.value_head = value_head
        self.param_dtype = resolve_dtype(fsdp.param_dtype, device)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        use_lora = lora is not None and lora_enabled(lora) and not value_head
        # a frozen LoRA base needs no float32 master copy: store it in the compute dtype
        kwargs = dict(
            dtype=self.param_dtype if use_lora else torch.float32,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
        if auto_class is not None:
            model = getattr(transformers, auto_class).from_pretrained(model_path, config=config, **kwargs)
        elif value_head:
            config.num_labels = 1
            model = AutoModelForTokenClassification.from_pretrained(model_path, config=config, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_path, config=config, **kwargs)
        self.varlen_reason = enable_varlen(model)  # None: packed rows attend per sequence without a mask
        if self.varlen_reason is not None:
            log.info("remove-padding packs with a block-diagonal mask: %s", self.varlen_reason)
        self.sp = ulysses.SequenceParallel.create(ulysses_sequence_parallel_size)
        if self.sp is not None:
            if self.varlen_reason is not None:
                raise ValueError(f"ulysses_sequence_parallel_size > 1 needs the varlen attention: {self.varlen_reason}")
            ulysses.check_heads(
                config.num_attention_heads,
                getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                self.sp.size,
                "",
            )
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.config = model.config
        self.lora: LoraModel | None = wrap_lora(model, lora, adapter_dtype=torch.float32) if use_lora else None
        self._lora_scalings = self.lora.scalings() if self.lora is not None else {}
        if compile_layers:
            layer_compile.compile_layers(_decoder_layers(model))
        if fsdp.dither_master_weights and not use_lora and self.param_dtype != torch.float32:
            moved = dither_masters(model.parameters(), self.param_dtype)
            log.info("%s compute: %.1f%% of the fp32 masters dithered off the grid", self.param_dtype, 100 * moved)
        mp = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=DTYPES[fsdp.reduce_dtype])
        offload = CPUOffloadPolicy() if (fsdp.param_offload and device.type == "cuda") else None
        world = dist.get_world_size() if dist.is_initialized() else 1
        # one worker computing in the storage dtype: FSDP2 would only add copies and hooks
        self.sharded = fsdp.shard_single_worker or world > 1 or offload is not None or self.param_dtype != torch.float32
        if self.sharded:
            shard_kwargs = {"mp_policy": mp}
            if offload is not None:
                shard_kwargs["offload_policy"] = offload
            for layer in _decoder_layers(model):
                fully_shard(layer, **shard_kwargs)
            fully_shard(model, **shard_kwargs)
        if offload is None:
            model.to(device)
        self.module = model
        self.router_tap = RouterTap.attach(model)  # MoE: router hooks (aux loss, load metrics, replay); None if dense
        self._has_logits_to_keep = "logits_to_keep" in inspect.signature(type(model).forward).parameters
        self._fusion = FusionGate()
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None

    # ------------------------------------------------------------ training
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps: every parameter, or the adapter's alone with LoRA."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def setup_optimizer(self, optim: OptimConfig, total_steps: int) -> None:
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(optim, total_steps))

    def offload_optimizer(self) -> None:
        """Move optimizer state to host memory between updates (frees device memory for the rollout engine)."""
        self._move_optimizer(torch.device("cpu"))

    def load_optimizer(self) -> None:
        self._move_optimizer(self.device)

    def _move_optimizer(self, device: torch.device) -> None:
        if self.optimizer is None or self.device.type == "cpu":
            return  # on CPU the state already lives in host memory
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu":
            torch.cuda.empty_cache()

    def clip_and_step(self, max_norm: float) -> float:
        """Clip the global grad norm, step if finite; returns the norm (nan/inf = step skipped)."""
        assert self.optimizer is not None
        norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm_f = float(norm)
        if math.isfinite(norm_f):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm_f

    # ------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_length: int,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        remove_padding: bool = True,
        chunk_size: int = 1024,
        response_logits_only: bool = True,
        fused_lm_head: bool = False,
        routed_experts: torch.Tensor | None = None,
    ) -> ForwardOut:
        """Log-probs (and entropy) of the response tokens, or values when this is a critic.

        `remove_padding` packs the valid tokens into one row (rlkit/workers/packing.py) whose sequences
        attend only to themselves (varlen attention, no (T x T) mask; models it cannot serve get the
        block-diagonal mask); with sequence parallelism the row is always packed and split over the group.
        `response_logits_only` runs the LM head only where a response token is predicted (the
        model's `logits_to_keep`), so no (rows x length x vocab) logits exist for prompt or pad
        positions; other response positions get log-prob 0 (they are masked by `response_mask`).
        `fused_lm_head` (with `response_logits_only`) computes them from the hidden states in chunks
        without keeping the logits for backward (rlkit/workers/fused_lm_head.py).
        `routed_experts` (b, S, layers, k): MoE routing replay (issue 18), the experts each token must use (-1 = its
        own), handed to the router tap selected exactly as the tokens are (packed + SP slice, or trimmed).
        """
        input_ids, attention_mask, position_ids = (t.to(self.device) for t in (input_ids, attention_mask, position_ids))
        routes = None if routed_experts is None else routed_experts.to(self.device).long()  # MoE routing replay
        if routes is not None and self.sp is not None:  # routing replay: the group's rows, as gather_rows below
            routes = self.sp.gather_rows(routes)[0][0]
        keep = response_logits_only and not self.value_head and self._has_logits_to_keep
        if fused_lm_head and not self.value_head and not keep:
            self._fusion.log_unfused("response_logits_only is off or the model takes no logits_to_keep")
        fused = fused_lm_head and keep and self._fusion.can_fuse(self.module)
        head = dict(temperature=temperature, with_entropy=with_entropy, chunk_size=chunk_size, fused=fused)
        if self.sp is not None:  # the group's micro-batches together, packed and split along the sequence
            (input_ids, attention_mask, position_ids), own = self.sp.gather_rows(
                input_ids, attention_mask, position_ids
            )
            return self._packed_forward(
                input_ids, attention_mask, position_ids, response_length, keep, head, routes
            ).rows(own)
        if remove_padding:
            return self._packed_forward(input_ids, attention_mask, position_ids, response_length, keep, head, routes)
        input_ids, attention_mask, position_ids = trim_left_padding(
            input_ids, attention_mask, position_ids, response_length
        )
        if routes is not None:  # routing replay: the columns trimming kept, row-major as the routers see them
            self._replay(routes[:, -input_ids.shape[1] :].flatten(0, 1))
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        if self.value_head:
            return ForwardOut(values=self.module(**kwargs).logits[:, -response_length - 1 : -1, 0].float())
        _, resp_need, labels = response_targets(input_ids, attention_mask, response_length)
        if keep:
            kwargs["logits_to_keep"] = response_length + 1
            rows = lambda kept: kept[:, :-1][resp_need]  # noqa: E731  (b, R+1, X) -> (K, X)
        else:
            rows = lambda logits: logits[:, -response_length - 1 : -1][resp_need]  # noqa: E731
        return self._scatter(resp_need, *head_log_probs(self.module, kwargs, rows, labels, **head))

    def _packed_forward(
        self, input_ids, attention_mask, position_ids, response_length, keep, head, routes=None
    ) -> ForwardOut:
        """The packed row, or under SP this rank's slice of it; outputs gathered back to (b, R)."""
        sp = self.sp
        packed = PackedRow.pack(input_ids, attention_mask, position_ids, multiple_of=sp.size if sp else 1)
        lo, hi = sp.slice(packed.length) if sp else (0, packed.length)
        if routes is not None:  # routing replay: the packed tokens' routes (-1 on the end padding), this rank's slice
            end = routes.new_full((packed.length - packed.tokens, *routes.shape[2:]), -1)
            self._replay(torch.cat([routes[packed.valid], end])[lo:hi])
        kwargs: dict[str, Any] = dict(
            input_ids=packed.input_ids[:, lo:hi], position_ids=packed.position_ids[:, lo:hi], use_cache=False
        )
        if self.varlen_reason is None:
            kwargs.update(packed_kwargs(packed.cu_seqlens, packed.max_len))
            if sp is not None:
                kwargs[ulysses.GROUP_KWARG] = sp.group
        else:
            kwargs["attention_mask"] = pack_mask(attention_mask, self.param_dtype)
        if self.value_head:
            values = self.module(**kwargs).logits[0, :, 0]  # (hi - lo,)
            per_token = packed.unpack(sp.gather(values) if sp else values)  # (b, L)
            return ForwardOut(values=per_token[:, -response_length - 1 : -1].float())
        need, resp_need, labels = response_targets(input_ids, attention_mask, response_length)
        kept = packed.index()[need]  # (K,) packed positions whose logits are needed, row-major
        local = (kept >= lo) & (kept < hi)
        at = kept[local] - lo
        if keep:
            kwargs["logits_to_keep"] = at
            rows = lambda out: out[0]  # noqa: E731  (1, K_local, X) -> (K_local, X)
        else:
            rows = lambda logits: logits[0, at]  # noqa: E731
        k_lp, k_ent = head_log_probs(self.module, kwargs, rows, labels[local], **head)
        if sp is not None:  # each rank holds the values at its slice's kept positions: gather the whole row's
            k_lp, k_ent = (
                None if v is None else sp.gather(v.new_zeros(hi - lo).index_put((at,), v))[kept] for v in (k_lp, k_ent)
            )
        return self._scatter(resp_need, k_lp, k_ent)

    def _replay(self, routes: torch.Tensor) -> None:
        """MoE routing replay: the next forward's routers use `routes` (tokens in the routers' order, layers, k)."""
        if self.router_tap is None:
            raise ValueError("routed_experts given to a model without routers")
        self.router_tap.replay(routes)

    @staticmethod
    def _scatter(resp_need: torch.Tensor, k_lp: torch.Tensor, k_ent: torch.Tensor | None) -> ForwardOut:
        """(K,) values at the needed response positions -> (b, R), 0 elsewhere."""
        lp = torch.zeros(resp_need.shape, dtype=torch.float32, device=resp_need.device)
        lp[resp_need] = k_lp
        ent = None
        if k_ent is not None:
            ent = torch.zeros_like(lp)
            ent[resp_need] = k_ent
        return ForwardOut(log_probs=lp, entropy=ent)

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
                tensor = tensor.full_tensor()
            yield name, tensor.detach()

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
    def save(self, path: Path, with_optimizer: bool = True) -> None:
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
            if self.scheduler is not None:
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

    def load(self, path: Path, with_optimizer: bool = True) -> None:
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
        if self.scheduler is not None and sched.exists():
            self.scheduler.load_state_dict(torch.load(sched, weights_only=False))
