"""Critic role: a value head on the policy's backbone type, trained with the clipped value loss."""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from rlkit.algo.value_loss import compute_value_loss
from rlkit.controller import Dispatch, Worker, register
from rlkit.debug import maybe_break
from rlkit.protocol import Batch
from rlkit.trainer.config_schema import RLConfig
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.micro_batch import loss_scales, split_by_count
from rlkit.workers.trainable import TrainableModelRole


class CriticWorker(Worker, TrainableModelRole):
    def __init__(self, cfg: RLConfig, model_path: str, total_steps: int) -> None:
        super().__init__()
        self.cfg, self.model_path, self.total_steps = cfg, model_path, total_steps

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_distributed()
        c = self.cfg.critic
        self.model = FSDPModel(
            self.model_path, c.fsdp_config, self.device, value_head=True,
            gradient_checkpointing=c.model.enable_gradient_checkpointing,
            attn_implementation=self.cfg.actor_rollout_ref.model.attn_implementation,
        )
        self.model.setup_optimizer(c.optim, self.total_steps)

    def _values(self, mb: Batch) -> torch.Tensor:
        return self.model.forward(
            mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"].shape[1],
            remove_padding=self.cfg.actor_rollout_ref.model.use_remove_padding,
        ).values

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_values(self, batch: Batch) -> Batch:
        maybe_break("critic.compute_values")
        start = time.perf_counter()
        self.model.module.eval()
        with torch.no_grad():
            micro = self.cfg.critic.ppo_micro_batch_size_per_gpu
            vals = [self._values(mb).float().cpu() for mb in split_by_count(batch, micro)]
        values = torch.cat(vals) * batch["response_mask"].float()
        return Batch({"values": values}, meta={"metrics": {"timing_s/values": time.perf_counter() - start}})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def update_critic(self, batch: Batch) -> Batch:
        maybe_break("critic.update")
        start = time.perf_counter()
        c = self.cfg.critic
        n = self.cfg.actor_rollout_ref.rollout.n
        mini_rows = max(1, (c.ppo_mini_batch_size or 1) * n // self.world_size)
        metrics: dict[str, list[float]] = defaultdict(list)
        self.model.module.train()
        for _ in range(c.ppo_epochs or 1):
            for mini in batch.split(mini_rows):
                micros = split_by_count(mini, c.ppo_micro_batch_size_per_gpu)
                scales = loss_scales([mb["response_mask"] for mb in micros], c.loss_agg_mode)
                for mb, weight in zip(micros, scales):
                    mask = mb["response_mask"].float().to(self.device)
                    vpreds = self._values(mb)
                    loss, clipfrac = compute_value_loss(
                        vpreds, mb["values"].to(self.device), mb["returns"].to(self.device), mask,
                        c.cliprange_value, c.loss_agg_mode,
                    )
                    (loss * weight).backward()
                    metrics["critic/vf_loss"].append(float(loss.detach()))
                    metrics["critic/vf_clipfrac"].append(float(clipfrac))
                metrics["critic/grad_norm"].append(self.model.clip_and_step(c.grad_clip))
        self.finish_update(metrics, "critic")
        metrics["timing_s/update_critic"].append(time.perf_counter() - start)
        return Batch(meta={"metrics": dict(metrics)})
