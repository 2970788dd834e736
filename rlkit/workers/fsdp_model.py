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

from rlkit.algo.utils import entropy_from_logits, logprobs_from_logits
from rlkit.config.schema import FSDPConfig, OptimConfig
from rlkit.models.lora import (
    ADAPTER_NAME,
    LoraModel,
    adapter_state_dict,
    lora_enabled,
    merged_named_tensors,
    peft_config_from_dict,
    read_lora_info,
    save_adapter_folder,
    wrap_lora,
    write_lora_info,
)
from rlkit.models.moe_router import RouterTap
from rlkit.utils.lr_schedule import lr_lambda
from rlkit.workers.fused_lm_head import fused_lm_head_logprob, unfusable_reason

log = logging.getLogger(__name__)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` = bf16 on GPU (fast, the field's default) and fp32 on CPU (bf16 matmuls are slow there)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


@dataclass
class ForwardOut:
    log_probs: torch.Tensor | None = None  # (b, R)
    entropy: torch.Tensor | None = None  # (b, R)
    values: torch.Tensor | None = None  # (b, R)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks, each its own FSDP unit (so only one is gathered at a time)."""
    for attr in ("model", "transformer", "gpt_neox", "backbone"):
        inner = getattr(model, attr, None)
        for name in ("layers", "h", "blocks"):
            layers = getattr(inner, name, None) if inner is not None else None
            if isinstance(layers, torch.nn.ModuleList):
                return list(layers)
    return []


def pack_mask(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-diagonal causal mask for the valid tokens of each row, laid end to end (remove-padding)."""
    valid = attention_mask.bool()
    seq_id = torch.arange(attention_mask.shape[0], device=valid.device).unsqueeze(1).expand_as(valid)[valid]
    t = seq_id.shape[0]
    causal = torch.arange(t, device=valid.device)
    allowed = (seq_id[:, None] == seq_id[None, :]) & (causal[:, None] >= causal[None, :])
    return valid, allowed[None, None]


def trim_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row (prompts are left-padded to the
    longest allowed prompt, usually much longer than this micro-batch's). Exact: those columns are
    masked out of attention; the response columns (counted from the end) are never touched."""
    has_token = attention_mask.bool().any(0)
    first = int(has_token.int().argmax()) if bool(has_token.any()) else 0
    first = min(first, max(0, input_ids.shape[1] - response_length - 1))
    return input_ids[:, first:], attention_mask[:, first:], position_ids[:, first:]


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
    ) -> None:
        """`auto_class`: a transformers Auto class name to load instead (the reward model's
        `AutoModelForSequenceClassification`); it gets the same wrapping, not `forward`'s heads."""
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

        self.device = device
        self.value_head = value_head
        self.param_dtype = resolve_dtype(fsdp.param_dtype, device)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        use_lora = lora is not None and lora_enabled(lora) and not value_head
        # a frozen LoRA base needs no float32 master copy: store it in the compute dtype
        kwargs = dict(dtype=self.param_dtype if use_lora else torch.float32, attn_implementation=attn_implementation,
                      trust_remote_code=trust_remote_code)
        if auto_class is not None:
            model = getattr(transformers, auto_class).from_pretrained(model_path, config=config, **kwargs)
        elif value_head:
            config.num_labels = 1
            model = AutoModelForTokenClassification.from_pretrained(model_path, config=config, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_path, config=config, **kwargs)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.config = model.config
        self.lora: LoraModel | None = wrap_lora(model, lora, adapter_dtype=torch.float32) if use_lora else None
        self._lora_scalings = self.lora.scalings() if self.lora is not None else {}
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

        `response_logits_only` runs the LM head only where a response token is predicted (the
        model's `logits_to_keep`), so no (rows x length x vocab) logits exist for prompt or pad
        positions; other response positions get log-prob 0 (they are masked by `response_mask`).
        `fused_lm_head` (with `response_logits_only`) computes them from the hidden states in chunks
        without keeping the logits for backward (rlkit/workers/fused_lm_head.py).
        `routed_experts` (b, S, layers, k): MoE routing replay, the experts each token must use (-1 = its own).
        """
        input_ids, attention_mask, position_ids = (t.to(self.device) for t in (input_ids, attention_mask, position_ids))
        if not remove_padding:  # padded rows: at least skip the columns no row uses
            input_ids, attention_mask, position_ids = trim_left_padding(
                input_ids, attention_mask, position_ids, response_length)
        if routed_experts is not None:  # routing replay: one route per token the routers see, selected as the tokens
            routes = routed_experts[:, -input_ids.shape[1] :].to(self.device)  # the columns trimming kept
            assert self.router_tap is not None, "routed_experts given to a model without routers"
            self.router_tap.replay(routes[attention_mask.bool()] if remove_padding else routes.flatten(0, 1))
        if response_logits_only and not self.value_head and self._has_logits_to_keep:
            return self._forward_response_logits(input_ids, attention_mask, position_ids, response_length,
                                                 temperature, with_entropy, remove_padding, chunk_size,
                                                 fused_lm_head and self._can_fuse_head())
        if fused_lm_head and not self.value_head:
            self._log_unfused("response_logits_only is off or the model takes no logits_to_keep")
        if remove_padding:
            valid, mask4d = pack_mask(attention_mask)
            out = self.module(
                input_ids=input_ids[valid].unsqueeze(0),
                position_ids=position_ids[valid].unsqueeze(0),
                attention_mask=mask4d,
                use_cache=False,
            )
            packed = out.logits[0]  # (T, V) or (T, 1)
            full = packed.new_zeros((*input_ids.shape, packed.shape[-1]))
            full[valid] = packed
            logits = full
        else:
            logits = self.module(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).logits
        if self.value_head:
            values = logits[:, -response_length - 1 : -1, 0].float()
            return ForwardOut(values=values)
        resp_logits = logits[:, -response_length - 1 : -1, :]
        if temperature != 1.0:
            resp_logits = resp_logits / temperature
        responses = input_ids[:, -response_length:]
        flat = resp_logits.reshape(-1, resp_logits.shape[-1])
        lp = logprobs_from_logits(flat, responses.reshape(-1), chunk_size=chunk_size).view(responses.shape)
        ent = entropy_from_logits(flat, chunk_size=chunk_size).view(responses.shape) if with_entropy else None
        return ForwardOut(log_probs=lp, entropy=ent)

    def _forward_response_logits(
        self, input_ids, attention_mask, position_ids, response_length, temperature, with_entropy, remove_padding,
        chunk_size, fused_lm_head=False,
    ) -> ForwardOut:
        length = input_ids.shape[1]
        # logits at column c predict token c+1: keep c where c+1 is a (non-pad) response token
        need = torch.zeros_like(attention_mask, dtype=torch.bool)
        need[:, length - response_length - 1 : length - 1] = attention_mask[:, length - response_length :].bool()
        need &= attention_mask.bool()
        resp_need = need[:, length - response_length - 1 : length - 1]
        labels = input_ids[:, length - response_length :][resp_need]
        if remove_padding:
            valid, mask4d = pack_mask(attention_mask)
            packed_pos = valid.reshape(-1).long().cumsum(0).view_as(valid) - 1  # index in the packed sequence
            kwargs = dict(input_ids=input_ids[valid].unsqueeze(0), position_ids=position_ids[valid].unsqueeze(0),
                          attention_mask=mask4d, use_cache=False, logits_to_keep=packed_pos[need])
            rows = lambda kept: kept[0]  # noqa: E731  (1, K, X) -> (K, X)
        else:
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False, logits_to_keep=response_length + 1)
            rows = lambda kept: kept[:, :-1][resp_need]  # noqa: E731  (b, R+1, X) -> (K, X)
        lp = torch.zeros(resp_need.shape, dtype=torch.float32, device=input_ids.device)
        ent = torch.zeros_like(lp) if with_entropy else None
        if fused_lm_head:
            k_lp, k_ent = self._fused_head_forward(kwargs, rows, labels, temperature, with_entropy, chunk_size)
        else:
            logits = rows(self.module(**kwargs).logits)  # (K, V)
            if temperature != 1.0:
                logits = logits / temperature
            k_lp = logprobs_from_logits(logits, labels, chunk_size=chunk_size)
            k_ent = entropy_from_logits(logits, chunk_size=chunk_size) if with_entropy else None
        lp[resp_need] = k_lp
        if ent is not None:
            ent[resp_need] = k_ent
        return ForwardOut(log_probs=lp, entropy=ent)

    def _fused_head_forward(self, model_kwargs, rows, labels, temperature, with_entropy, chunk_size):
        """The model's forward with its LM head standing in as the fused log-prob of `labels`.

        The head is called inside the top module's forward, where FSDP2 has gathered the root unit's
        parameters (the head's weight, tied to the embedding or not), and its gradient flows through
        the same unsharded parameter as the plain path's, so sharding and grad reduction are unchanged.
        """
        head = self.module.get_output_embeddings()
        out: dict[str, Any] = {}

        def fused_head(kept: torch.Tensor) -> torch.Tensor:
            out["lp"], out["ent"] = fused_lm_head_logprob(rows(kept), head.weight, head.bias, labels, temperature,
                                                          chunk_size, with_entropy)
            return kept.new_zeros((*kept.shape[:-1], 1))  # the "logits" the model returns: unused

        head.forward = fused_head
        try:
            self.module(**model_kwargs)
        finally:
            del head.forward  # back to the class's forward
        return out["lp"], out["ent"]

    def _can_fuse_head(self) -> bool:
        reason = unfusable_reason(self.module)
        if reason is not None:
            self._log_unfused(reason)
        return reason is None

    def _log_unfused(self, reason: str) -> None:
        if not getattr(self, "_unfused_logged", False):
            log.warning("fused_lm_head: using the plain LM head path (%s)", reason)
            self._unfused_logged = True

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
        for state in (self.optimizer.state.values() if self.optimizer is not None else []):
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


def export_hf(checkpoint_actor_dir: Path, out_dir: Path, tokenizer_dir: Path | None = None,
              adapter_only: bool = False) -> Path:
    """Turn a sharded actor checkpoint into a plain HF folder, in one process (no cluster needed).

    A LoRA checkpoint (it holds the adapter only) is merged into its base model; `adapter_only`
    writes the PEFT adapter folder instead (`PeftModel.from_pretrained(base, out_dir)` loads it)."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    lora_info = read_lora_info(checkpoint_actor_dir)
    if adapter_only and lora_info is None:
        raise ValueError(f"{checkpoint_actor_dir} is a full fine-tuning checkpoint: it has no adapter to export "
                         "(drop --adapter-only)")
    out_dir.mkdir(parents=True, exist_ok=True)
    if lora_info is not None:
        export_lora(checkpoint_actor_dir, out_dir, lora_info, adapter_only)
    else:
        config = AutoConfig.from_pretrained(checkpoint_actor_dir / "hf_config")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=str(checkpoint_actor_dir), no_dist=True)
        model.load_state_dict(state["model"])
        model.save_pretrained(out_dir)
    if tokenizer_dir is not None and tokenizer_dir.exists():
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    return out_dir


def export_lora(checkpoint_actor_dir: Path, out_dir: Path, lora_info: dict, adapter_only: bool) -> None:
    """The adapter of a LoRA checkpoint on its base model (`lora.json` names both): merged HF folder, or the
    PEFT adapter folder alone."""
    import torch.distributed.checkpoint as dcp
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = lora_info["base_model"]
    if not Path(base).is_dir():
        raise ValueError(f"the checkpoint's base model {base} is not a folder here; the LoRA checkpoint holds only "
                         "the adapter, so export needs the base it was trained on")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, peft_config_from_dict(lora_info["peft_config"]))
    adapter = {k: v for k, v in model.state_dict().items() if ".lora_" in k}
    state = {"model": adapter}
    dcp.load(state, checkpoint_id=str(checkpoint_actor_dir), no_dist=True)
    missing = set(adapter) - set(state["model"])
    if missing:
        raise ValueError(f"adapter tensors missing from the checkpoint: {sorted(missing)[:4]}")
    model.load_state_dict(state["model"], strict=False)
    if adapter_only:
        save_adapter_folder(out_dir, peft_model.peft_config[ADAPTER_NAME], adapter_state_dict(adapter.items()),
                            base_model=base)
    else:
        peft_model.merge_and_unload().save_pretrained(out_dir)
