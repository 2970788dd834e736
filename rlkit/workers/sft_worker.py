"""The SFT role: the actor's FSDP2 model trained on token cross-entropy over the loss mask, with the shared update loop.

A batch row is one whole conversation, right-padded (`input_ids`, `attention_mask`, `position_ids`, (b, S)); the
targets are the tokens after the first, `responses` = input_ids[:, 1:], and `response_mask` (b, S-1) marks those
the loss covers (assistant tokens; rlkit.data.chat_mask). The policy forward then yields log p(token | prefix) for
every target, packed (varlen, no attention across conversations) or padded, the same head the actor uses.
"""

from __future__ import annotations

import time

import torch

from rlkit.algo.loss_agg import agg_loss
from rlkit.config.fsdp import FSDPConfig
from rlkit.config.sft_schema import SFTModelConfig, SFTOptimConfig
from rlkit.controller import Dispatch, Worker, register
from rlkit.protocol import Batch
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.heads import ForwardOut
from rlkit.workers.micro_batch import MicroBatching, in_row_order
from rlkit.workers.model_inputs import ModelInputs
from rlkit.workers.trainable import MicroLoss, TrainableModelRole, UpdatePlan

LOSS_AGG = "token-mean"  # every assistant token of the step weighs the same, whichever conversation holds it
NLL_SUM, LOSS_TOKENS = "train/nll_sum", "train/loss_tokens"  # per micro-batch; the step's loss is their ratio


def step_loss(metrics: dict[str, list[float]]) -> float:
    """The step's token-mean loss from every rank's micro-batch sums (removed from `metrics`)."""
    return sum(metrics.pop(NLL_SUM)) / max(sum(metrics.pop(LOSS_TOKENS)), 1.0)


class SFTWorker(Worker, TrainableModelRole):
    """One data-parallel rank of the supervised model. `train_batch` is one optimizer step over this rank's rows."""

    def __init__(self, model: SFTModelConfig, engine: FSDPConfig, optim: SFTOptimConfig, *, total_steps: int,
                 seed: int, micro: MicroBatching, packed: bool) -> None:
        """`model` with `path` a local folder; `total_steps` sizes the LR schedule; `micro` cuts a rank's rows into
        forward/backward calls (a count or a token budget); `packed`: data.pad_mode=no_padding."""
        super().__init__()
        self.model_cfg, self.engine, self.optim = model, engine, optim
        self.total_steps, self.seed, self.micro, self.packed = total_steps, seed, micro, packed

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        start = time.perf_counter()
        self.init_distributed()
        torch.manual_seed(self.seed)
        m = self.model_cfg
        self.model = FSDPModel(
            m.path, self.engine, self.device, gradient_checkpointing=m.enable_gradient_checkpointing,
            attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code, lora=m,
            fused_lm_head=m.use_fused_kernels, compile_layers=m.use_torch_compile,
        )
        self.model.setup_optimizer(self.optim, self.total_steps)
        return {"init_s": time.perf_counter() - start, **self.model.memory_report()}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def memory_report(self) -> dict[str, float]:
        return self.model.memory_report()

    def _forward(self, mb: Batch) -> ForwardOut:
        inputs = ModelInputs.of(mb["input_ids"], mb["attention_mask"], mb["position_ids"])
        return self.model.forward(inputs, response_length=mb["responses"].shape[1], remove_padding=self.packed,
                                  chunk_size=self.model_cfg.logits_chunk_size, response_logits_only=True,
                                  loss_mask=mb["response_mask"].bool())

    def _nll_loss(self) -> MicroLoss:
        def loss_fn(mb: Batch) -> tuple[torch.Tensor, dict[str, float]]:
            mask = mb["response_mask"].float().to(self.device)
            nll = -self._forward(mb).log_probs * mask
            loss = agg_loss(nll, mask, LOSS_AGG)
            return loss, {NLL_SUM: float(nll.detach().sum()), LOSS_TOKENS: float(mask.sum())}
        return loss_fn

    @register(dispatch=Dispatch.DP_COMPUTE)
    def train_batch(self, batch: Batch) -> Batch:
        """One optimizer step on this rank's rows; per micro-batch its NLL sum and loss tokens (`step_loss`)."""
        plan = UpdatePlan(epochs=1, mini_batch_rows=max(1, len(batch)), micro=self.micro, loss_agg_mode=LOSS_AGG,
                          grad_clip=self.optim.clip_grad, optimizer_offload=self.engine.optimizer_offload)
        metrics = self.run_update(batch, plan, self._nll_loss(), "train")
        return Batch(meta={"metrics": metrics})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def eval_loss(self, batch: Batch) -> Batch:
        """Per row: the summed negative log-likelihood of its loss tokens and their count (no grad)."""
        self.model.module.eval()
        nll = []
        micros, order = self.micro.split(batch)
        with torch.no_grad():
            for mb in micros:
                lp = self._forward(mb).log_probs.float().cpu()
                nll.append(-(lp * mb["response_mask"].float()).sum(-1))
        return Batch({"nll_sum": in_row_order(nll, order), "loss_tokens": batch["response_mask"].float().sum(-1)})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Rank 0 gets the full weights (tests compare runs with it); other ranks take part and get None."""
        state = self.model.full_state_dict()
        return state if self.rank == 0 else None
