"""Actor and reference roles: FSDP2 policies that score and (the actor) train on rollouts."""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from rlkit.algo import KL_ESTIMATORS, POLICY_LOSSES
from rlkit.algo.utils import agg_loss, masked_mean
from rlkit.controller import Dispatch, Worker, register
from rlkit.debug import maybe_break
from rlkit.protocol import Batch
from rlkit.trainer.config_schema import RLConfig
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.micro_batch import loss_scales, split_by_count, split_by_tokens
from rlkit.workers.trainable import TrainableModelRole

FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]


def _micro_batches(batch: Batch, count: int, dynamic: bool, max_tokens: int) -> list[Batch]:
    return split_by_tokens(batch, max_tokens) if dynamic else split_by_count(batch, count)


class _PolicyScorer(Worker):
    """Shared by actor and reference: micro-batched log-prob forward without grad."""

    model: FSDPModel
    cfg: RLConfig

    def _log_probs(self, batch: Batch, micro: int, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        model_cfg = self.cfg.actor_rollout_ref.model
        actor_cfg = self.cfg.actor_rollout_ref.actor
        response_length = batch["responses"].shape[1]
        temperature = self.cfg.actor_rollout_ref.rollout.temperature
        lps, ents = [], []
        self.model.module.eval()
        with torch.no_grad():
            for mb in split_by_count(batch.select(FORWARD_KEYS), micro):
                out = self.model.forward(
                    mb["input_ids"],
                    mb["attention_mask"],
                    mb["position_ids"],
                    response_length,
                    temperature=temperature,
                    with_entropy=with_entropy,
                    remove_padding=model_cfg.use_remove_padding,
                    chunk_size=actor_cfg.logits_chunk_size,
                    response_logits_only=model_cfg.response_logits_only,
                )
                lps.append(out.log_probs.float().cpu())
                if with_entropy:
                    ents.append(out.entropy.float().cpu())
        return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


class ActorWorker(_PolicyScorer, TrainableModelRole):
    """The trained policy. `update_actor` runs PPO epochs over mini-batches with the registered loss."""

    def __init__(self, cfg: RLConfig, model_path: str, total_steps: int) -> None:
        super().__init__()
        self.cfg, self.model_path, self.total_steps = cfg, model_path, total_steps

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        start = time.perf_counter()
        self.init_distributed()
        torch.manual_seed(self.cfg.trainer.seed)
        arr = self.cfg.actor_rollout_ref
        self.model = FSDPModel(
            self.model_path,
            arr.actor.fsdp_config,
            self.device,
            gradient_checkpointing=arr.model.enable_gradient_checkpointing,
            attn_implementation=arr.model.attn_implementation,
            trust_remote_code=arr.model.trust_remote_code,
        )
        self.model.setup_optimizer(arr.actor.optim, self.total_steps)
        params = sum(p.numel() for p in self.model.module.parameters())
        return {"init_s": time.perf_counter() - start, "local_params": params}

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch) -> Batch:
        maybe_break("actor.compute_log_prob")
        start = time.perf_counter()
        micro = self.cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
        lp, ent = self._log_probs(batch, micro, with_entropy=True)
        mask = batch["response_mask"].float()
        metrics = {"actor/entropy": float(masked_mean(ent, mask)), "timing_s/old_log_prob": time.perf_counter() - start}
        return Batch({"old_log_probs": lp, "entropys": ent}, meta={"metrics": metrics})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch) -> Batch:
        """PPO update; if `old_log_probs` is absent (on-policy, one pass) the first forward supplies it."""
        maybe_break("actor.update_policy")
        start = time.perf_counter()
        cfg = self.cfg.actor_rollout_ref.actor
        algo = self.cfg.algorithm
        n = self.cfg.actor_rollout_ref.rollout.n
        mini_rows = max(1, cfg.ppo_mini_batch_size * n // self.world_size)
        loss_fn = POLICY_LOSSES.get(cfg.policy_loss)
        kl_fn = KL_ESTIMATORS.get(cfg.kl_loss_type) if cfg.use_kl_loss else None
        response_length = batch["responses"].shape[1]
        temperature = self.cfg.actor_rollout_ref.rollout.temperature
        metrics: dict[str, list[float]] = defaultdict(list)
        offload = cfg.fsdp_config.optimizer_offload
        if offload:
            self.model.load_optimizer()
        self.model.module.train()
        gen = torch.Generator().manual_seed(self.cfg.trainer.seed + self.rank)
        for _epoch in range(cfg.ppo_epochs):
            data = batch.index(torch.randperm(len(batch), generator=gen)) if cfg.shuffle else batch
            for mini in data.split(mini_rows):
                micros = _micro_batches(mini, cfg.ppo_micro_batch_size_per_gpu, cfg.use_dynamic_bsz,
                                        cfg.ppo_max_token_len_per_gpu)
                scales = loss_scales([mb["response_mask"] for mb in micros], cfg.loss_agg_mode)
                for mb, weight in zip(micros, scales):
                    mask = mb["response_mask"].float().to(self.device)
                    out = self.model.forward(
                        mb["input_ids"], mb["attention_mask"], mb["position_ids"], response_length,
                        temperature=temperature, with_entropy=cfg.entropy_coeff != 0,
                        remove_padding=self.cfg.actor_rollout_ref.model.use_remove_padding,
                        chunk_size=cfg.logits_chunk_size,
                        response_logits_only=self.cfg.actor_rollout_ref.model.response_logits_only,
                    )
                    lp = out.log_probs
                    old = mb["old_log_probs"].to(self.device) if "old_log_probs" in mb else lp.detach()
                    is_weights = None
                    if algo.rollout_is and "rollout_log_probs" in mb:
                        rollout_lp = mb["rollout_log_probs"].to(self.device)
                        is_weights = torch.exp(old - rollout_lp).clamp(max=algo.rollout_is_threshold).detach()
                    pg = loss_fn(
                        old, lp, mb["advantages"].to(self.device), mask,
                        clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                        clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg_mode,
                        rollout_is_weights=is_weights,
                    )
                    loss = pg["pg_loss"]
                    if cfg.entropy_coeff != 0:
                        ent_loss = agg_loss(out.entropy, mask, cfg.loss_agg_mode)
                        loss = loss - cfg.entropy_coeff * ent_loss
                        metrics["actor/entropy_loss"].append(float(ent_loss.detach()))
                    if kl_fn is not None:
                        kl = kl_fn(lp, mb["ref_log_prob"].to(self.device))
                        kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode)
                        loss = loss + cfg.kl_loss_coef * kl_loss
                        metrics["actor/kl_loss"].append(float(kl_loss.detach()))
                    (loss * weight).backward()
                    metrics["actor/pg_loss"].append(float(pg["pg_loss"].detach()))
                    metrics["actor/pg_clipfrac"].append(float(pg["pg_clipfrac"]))
                    metrics["actor/ppo_kl"].append(float(pg["ppo_kl"]))
                    metrics["actor/pg_clipfrac_lower"].append(float(pg["pg_clipfrac_lower"]))
                metrics["actor/grad_norm"].append(self.model.clip_and_step(cfg.grad_clip))
        if offload:
            self.model.offload_optimizer()
        self.finish_update(metrics, "actor")
        metrics["timing_s/update_actor"].append(time.perf_counter() - start)
        return Batch(meta={"metrics": dict(metrics)})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Rank 0 gets the full weights (for export and tests); other ranks take part and get None."""
        state = self.model.full_state_dict()
        return state if self.rank == 0 else None


class RefWorker(_PolicyScorer):
    """The frozen reference policy (only created when a KL term needs it)."""

    def __init__(self, cfg: RLConfig, model_path: str) -> None:
        super().__init__()
        self.cfg, self.model_path = cfg, model_path

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_distributed()
        arr = self.cfg.actor_rollout_ref
        self.model = FSDPModel(
            self.model_path, arr.ref.fsdp_config, self.device,
            attn_implementation=arr.model.attn_implementation, trust_remote_code=arr.model.trust_remote_code,
        )
        for p in self.model.module.parameters():
            p.requires_grad_(False)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        maybe_break("ref.compute_log_prob")
        start = time.perf_counter()
        lp, _ = self._log_probs(batch, self.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu, False)
        return Batch({"ref_log_prob": lp}, meta={"metrics": {"timing_s/ref": time.perf_counter() - start}})
