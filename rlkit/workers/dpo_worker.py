"""The DPO role: the SFT role's FSDP2 policy and update loop with a preference loss, and a frozen reference beside it.

A batch row is one preference pair (rlkit.data.preference.pairs_batch: the chosen and the rejected sequence side by
side), so the shared update loop's micro-batches never part a pair; a forward unfolds them into 2b rows in the RL
layout. The reference is a second FSDP2 model held frozen in the same worker, as the RL reference role holds it
(`dpo.ref.model_path`, default the policy's start); with LoRA it is the policy with its adapter off, as the actor
scores its reference, so the base weights exist once. With dpo.ref.precompute the trainer has the reference score
every pair once (`compute_ref_logps`) and then drops it (`release_reference`); a step's pairs then carry those
numbers, `ref_logps`, instead of `ref_log_prob`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator

import torch

from rlkit.algo.preference_loss import preference_loss, reference_logps
from rlkit.config.dpo_schema import DPOSection
from rlkit.config.fsdp import FSDPConfig
from rlkit.config.sft_schema import SFTModelConfig, SFTOptimConfig
from rlkit.controller import Dispatch, register
from rlkit.data.preference import as_sequences, side_by_side, split_sides
from rlkit.protocol import Batch
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.micro_batch import MicroBatching, in_row_order
from rlkit.workers.model_inputs import ModelInputs
from rlkit.workers.sft_worker import SFTWorker
from rlkit.workers.trainable import MicroLoss, UpdatePlan

#: micro-batch weights by pairs: every pair row holds response tokens, so "sequences" counts pairs
PAIR_AGG = "seq-mean-token-mean"


class DPOWorker(SFTWorker):
    """One data-parallel rank of the policy and its reference. `train_batch` is one optimizer step over this rank's
    pairs, which carry `ref_log_prob` (from `compute_ref_log_prob`)."""

    def __init__(self, model: SFTModelConfig, engine: FSDPConfig, optim: SFTOptimConfig, dpo: DPOSection, *,
                 ref_path: str, total_steps: int, seed: int, micro: MicroBatching, packed: bool) -> None:
        """`dpo`: the dpo section; `ref_path`: the reference's local folder (dpo.ref.model_path resolved, else
        model.path; unused with LoRA). The rest as SFTWorker's."""
        super().__init__(model, engine, optim, total_steps=total_steps, seed=seed, micro=micro, packed=packed)
        self.dpo, self.ref_path = dpo, ref_path
        self.ref: FSDPModel | None = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        report = super().init_model()
        if self.model.lora is None:
            frozen = dataclasses.replace(self.engine, dither_master_weights=False)  # never updated: no dither
            m = self.model_cfg
            self.ref = FSDPModel(self.ref_path, frozen, self.device, attn_implementation=m.attn_implementation,
                                 trust_remote_code=m.trust_remote_code, fused_lm_head=m.use_fused_kernels,
                                 compile_layers=m.use_torch_compile)
            for p in self.ref.module.parameters():
                p.requires_grad_(False)
        return {**report, "ref_mb": self._ref_mb()}

    @contextlib.contextmanager
    def _reference(self) -> Iterator[FSDPModel]:
        """The reference model: the frozen copy, or (LoRA) the policy with its adapter off."""
        if self.ref is not None:
            yield self.ref
            return
        if self.model.lora is None:
            raise RuntimeError("the reference was released (dpo.ref.precompute); read the precomputed ref_logps")
        with self.model.lora.disabled():
            yield self.model

    def _sequence_log_probs(self, model: FSDPModel, pairs: Batch) -> tuple[torch.Tensor, Batch]:
        """Token log-probs (2b, R) of the pairs' 2b sequences (chosen rows first) under `model`, and those rows."""
        rows = as_sequences(pairs)
        inputs = ModelInputs.of(rows["input_ids"], rows["attention_mask"], rows["position_ids"])
        out = model.forward(inputs, response_length=rows["responses"].shape[1], remove_padding=self.packed,
                            chunk_size=self.model_cfg.logits_chunk_size, response_logits_only=True)
        return out.log_probs, rows

    def _pair_log_probs(self, batch: Batch, reference: bool) -> torch.Tensor:
        """(B, 2R) log-probs of the pair rows (chosen ++ rejected), micro-batched, no grad."""
        outs = []
        micros, order = self.micro.split(batch)
        scope = self._reference() if reference else contextlib.nullcontext(self.model)
        with scope as model, torch.no_grad():
            model.module.eval()
            for mb in micros:
                lp, _ = self._sequence_log_probs(model, mb)
                outs.append(side_by_side(lp.float().cpu()))
        return in_row_order(outs, order)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """The reference's token log-probs of every pair, `ref_log_prob` (B, 2R) in the pair layout."""
        return Batch({"ref_log_prob": self._pair_log_probs(batch, reference=True)})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_ref_logps(self, batch: Batch) -> Batch:
        """The reference's completion log-probs of every pair, `ref_logps` (B, 2): chosen, rejected, reduced as
        dpo.loss_type reads them, on the device as the loss reduces them, so they equal the per-step path's."""
        tokens = self._pair_log_probs(batch, reference=True).to(self.device)
        masks = split_sides(batch["response_mask"].to(self.device))
        sides = [reference_logps(t, m, self.dpo.loss_type) for t, m in zip(split_sides(tokens), masks, strict=True)]
        return Batch({"ref_logps": torch.stack(sides, dim=1).cpu()})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def release_reference(self) -> dict[str, float]:
        """Drop the frozen reference (after the precompute): `ref_freed_mb`, this rank's share of its weights.
        With LoRA there is no copy to drop (the reference is the policy's own base weights): 0."""
        freed = self._ref_mb()
        allocated = torch.cuda.memory_allocated() if self.device.type == "cuda" else 0
        self.ref = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            freed_device = (allocated - torch.cuda.memory_allocated()) / 2**20
            return {"ref_freed_mb": freed, "ref_freed_device_mb": freed_device}
        return {"ref_freed_mb": freed}

    def _ref_mb(self) -> float:
        """This rank's bytes of the reference's parameters and buffers (its FSDP shards), in MiB; 0 once released."""
        if self.ref is None:
            return 0.0
        tensors = [*self.ref.module.parameters(), *self.ref.module.buffers()]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local) / 2**20

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def memory_report(self) -> dict[str, float]:
        """The policy's report and `ref_mb`: the frozen reference's share of this rank (0 with LoRA or released)."""
        return {**self.model.memory_report(), "ref_mb": self._ref_mb()}

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """The policy's token log-probs of every pair, `log_probs` (B, 2R), no grad (validation)."""
        return Batch({"log_probs": self._pair_log_probs(batch, reference=False)})

    def _dpo_loss(self) -> MicroLoss:
        d = self.dpo

        def loss_fn(mb: Batch) -> tuple[torch.Tensor, dict[str, float]]:
            lp, rows = self._sequence_log_probs(self.model, mb)
            mask = rows["response_mask"].to(self.device)
            chosen, rejected = lp.chunk(2)
            # the stored reference (dpo.ref.precompute: (b, 2) completion log-probs) or this step's (b, 2R) tokens
            if "ref_logps" in mb:
                ref_chosen, ref_rejected = mb["ref_logps"].to(self.device).unbind(1)
            else:
                ref_chosen, ref_rejected = split_sides(mb["ref_log_prob"].to(self.device))
            out = preference_loss(chosen, rejected, ref_chosen, ref_rejected, *mask.chunk(2), loss_type=d.loss_type,
                                  beta=d.beta, label_smoothing=d.label_smoothing, rpo_alpha=d.rpo_alpha)
            metrics = {("train/loss" if k == "loss" else f"train/{k}" if k == "nll_loss" else k): float(v.detach())
                       for k, v in out.items()}
            return out["loss"], metrics

        return loss_fn

    @register(dispatch=Dispatch.DP_COMPUTE)
    def train_batch(self, batch: Batch) -> Batch:
        """One optimizer step on this rank's pairs; the loss and TRL's rewards/* per micro-batch."""
        plan = UpdatePlan(epochs=1, mini_batch_rows=max(1, len(batch)), micro=self.micro, loss_agg_mode=PAIR_AGG,
                          grad_clip=self.optim.clip_grad, optimizer_offload=self.engine.optimizer_offload)
        metrics = self.run_update(batch, plan, self._dpo_loss(), "train")
        return Batch(meta={"metrics": metrics})
