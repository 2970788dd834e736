"""Critic role: a value head on the policy's backbone type, trained with the clipped value loss.

It receives its own config section (`critic`) and the few run values it reads as constructor
arguments (`rlkit.trainer.run.roles` builds them); the update is the shared loop of `trainable.py`.
"""

from __future__ import annotations

import torch

from rlkit.algo.value_loss import compute_value_loss
from rlkit.config.schema import CriticConfig
from rlkit.controller import Dispatch, Worker, register
from rlkit.debug import maybe_break
from rlkit.protocol import Batch
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.micro_batch import MicroBatching, in_row_order
from rlkit.workers.model_inputs import ModelInputs
from rlkit.workers.trainable import TrainableModelRole, UpdatePlan


class CriticWorker(Worker, TrainableModelRole):
    def __init__(self, critic: CriticConfig, *, total_steps: int, rollout_n: int, attn_implementation: str = "sdpa",
                 use_remove_padding: bool = False) -> None:
        """`critic`: the critic section, `critic.model.path` a local folder. `total_steps` sizes the LR schedule;
        `rollout_n` (samples per prompt) turns ppo_mini_batch_size prompts into rows; `attn_implementation` and
        `use_remove_padding` are the policy model's (actor_rollout_ref.model), shared by both models."""
        super().__init__()
        self.critic, self.total_steps, self.rollout_n = critic, total_steps, rollout_n
        self.checkpoint_contents = critic.checkpoint
        self.attn_implementation, self.use_remove_padding = attn_implementation, use_remove_padding

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_distributed()
        c = self.critic
        self.model = FSDPModel(
            c.model.path, c.fsdp_config, self.device, value_head=True,
            gradient_checkpointing=c.model.enable_gradient_checkpointing,
            attn_implementation=self.attn_implementation,
            ulysses_sequence_parallel_size=c.ulysses_sequence_parallel_size,
        )
        self.model.setup_optimizer(c.optim, self.total_steps)

    def _values(self, mb: Batch) -> torch.Tensor:
        inputs = ModelInputs.of(mb["input_ids"], mb["attention_mask"], mb["position_ids"])
        return self.model.forward(
            inputs, response_length=mb["responses"].shape[1], remove_padding=self.use_remove_padding
        ).values

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_values(self, batch: Batch) -> Batch:
        maybe_break("critic.compute_values")
        self.model.module.eval()
        c = self.critic
        micro = MicroBatching(c.forward_micro_batch_size_per_gpu, c.use_dynamic_bsz, c.forward_max_token_len_per_gpu)
        with torch.no_grad():
            micros, order = micro.split(batch.select(["input_ids", "attention_mask", "position_ids", "responses"]))
            values = in_row_order([self._values(mb).float().cpu() for mb in micros], order)
        values = values * batch["response_mask"].float()
        return Batch({"values": values})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def update_critic(self, batch: Batch) -> Batch:
        maybe_break("critic.update")
        c = self.critic
        plan = UpdatePlan(
            epochs=c.ppo_epochs or 1, mini_batch_rows=max(1, (c.ppo_mini_batch_size or 1) * self.rollout_n
                                                          // self.world_size),
            micro=MicroBatching(c.ppo_micro_batch_size_per_gpu, c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu),
            loss_agg_mode=c.loss_agg_mode, grad_clip=c.grad_clip,
            optimizer_offload=c.fsdp_config.optimizer_offload,
        )
        return Batch(meta={"metrics": self.run_update(batch, plan, self._value_loss, "critic")})

    def _value_loss(self, mb: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The critic's micro-batch loss: the clipped value loss against the returns."""
        mask = mb["response_mask"].float().to(self.device)
        vpreds = self._values(mb)
        loss, clipfrac = compute_value_loss(
            vpreds, mb["values"].to(self.device), mb["returns"].to(self.device), mask,
            self.critic.cliprange_value, self.critic.loss_agg_mode,
        )
        return loss, {"critic/vf_loss": float(loss.detach()), "critic/vf_clipfrac": float(clipfrac)}
