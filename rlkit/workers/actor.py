"""Actor and reference roles: FSDP2 policies that score and (the actor) train on rollouts.

Each receives its own config section and the few run values it reads, as constructor
arguments (`rlkit.trainer.run.roles` builds them from the run config); none sees the whole config.

With LoRA (`actor_rollout_ref.model.lora_rank` > 0) there is no reference worker: the actor
scores the reference itself with its adapter switched off (`compute_ref_log_prob`), so the
base weights exist once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from rlkit.algo import KL_ESTIMATORS, POLICY_LOSSES
from rlkit.algo.distill_loss import DistillInputs, distill_loss
from rlkit.algo.loss_agg import agg_loss
from rlkit.algo.policy_loss import LOSS_PARAMS
from rlkit.algo.rollout_correction import RolloutCorrection
from rlkit.algo.utils import masked_mean
from rlkit.config.distillation import DistillationLossConfig
from rlkit.config.schema import ActorConfig, ModelConfig, RefConfig
from rlkit.controller import Dispatch, Worker, register
from rlkit.data.images import MODEL_INPUTS
from rlkit.debug import maybe_break
from rlkit.debug.anomaly import SAMPLE_ID_KEYS, check_tensor, watch_gradient
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.heads import ForwardOut
from rlkit.workers.is_batch_norm import batch_is_scale
from rlkit.workers.micro_batch import MicroBatching, in_row_order
from rlkit.workers.model_inputs import ModelInputs
from rlkit.workers.route_capture import positions, routes
from rlkit.workers.topk import response_log_softmax
from rlkit.workers.trainable import MicroLoss, TrainableModelRole, UpdatePlan

FORWARD_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]


class _PolicyScorer(Worker):
    """Shared by actor and reference: the policy forward, and micro-batched log-probs without grad."""

    model: FSDPModel
    model_cfg: ModelConfig  # `path` is a local HF folder
    temperature: float  # the rollout's: log-probs of the distribution the samples were drawn from
    logits_chunk_size: int
    router_replay: bool = False  # MoE: forward with the batch's experts (`routed_experts`)
    router_replay_from: str = "rollout"  # whose: the engine's (verl's R3) or the old-log-prob pass's (R2)

    def _forward(self, mb: Batch, response_length: int, with_entropy: bool,
                 with_sum_pi_squared: bool = False, capture: bool = False) -> ForwardOut:
        """`capture`: the routers' choices are recorded with each token's place (rlkit/workers/route_capture.py)."""
        inputs = ModelInputs.of(mb["input_ids"], mb["attention_mask"], mb["position_ids"], self._routes(mb))
        if capture:
            inputs = inputs.with_extra(self.router_tap.POSITIONS, positions(*mb["input_ids"].shape, self.model.sp))
        if MODEL_INPUTS in mb.non_tensors:  # a vision-language batch: the rows' images (rlkit/data/images.py)
            inputs = inputs.with_images(self.model.module, list(mb.non_tensors[MODEL_INPUTS]))
        return self.model.forward(
            inputs, response_length=response_length, temperature=self.temperature, with_entropy=with_entropy,
            remove_padding=self.model_cfg.use_remove_padding, chunk_size=self.logits_chunk_size,
            response_logits_only=self.model_cfg.response_logits_only, with_sum_pi_squared=with_sum_pi_squared,
        )

    def _routes(self, mb: Batch) -> torch.Tensor | None:
        if not self.router_replay:
            return None
        if "routed_experts" not in mb and self.router_replay_from == "old_log_prob":
            return None  # no old-log-prob pass (one on-policy pass): the update's own routes are the old policy's
        if "routed_experts" not in mb:
            raise UserError("actor_rollout_ref.actor.router_replay=true but the rollout returned no routed_experts: "
                            "use a rollout that records them (rollout.name=hf; docs/moe.md) or set router_replay=false")
        return mb["routed_experts"]

    def _log_probs(self, batch: Batch, micro: MicroBatching, with_entropy: bool,
                   with_sum_pi_squared: bool = False, capture_routes: bool = False) -> ForwardOut:
        """Per-token log-probs (and entropies, sum_v pi_v^2) of the batch's rows on CPU, in its row order, `micro`
        rows per forward; `capture_routes`: also each token's experts (`routed_experts`, (B, S, layers, k))."""
        response_length = batch["responses"].shape[1]
        parts: dict[str, list[torch.Tensor]] = {"log_probs": [], "entropy": [], "sum_pi_squared": [],
                                                "routed_experts": []}
        self.model.module.eval()
        with torch.no_grad():
            keys = FORWARD_KEYS + (["routed_experts"] if self.router_replay and "routed_experts" in batch else [])
            keys += [MODEL_INPUTS] if MODEL_INPUTS in batch.non_tensors else []
            keys += [k for k in SAMPLE_ID_KEYS if k in batch]  # the rows' ids, for --debug nan (shared, not copied)
            micros, order = micro.split(batch.select(keys))
            for mb in micros:
                with self.router_tap.capturing() if capture_routes else contextlib.nullcontext() as records:
                    out = self._forward(mb, response_length, with_entropy, with_sum_pi_squared, capture_routes)
                if capture_routes:
                    out = dataclasses.replace(out, routed_experts=routes(records, mb["attention_mask"],
                                                                         self.router_tap.top_k, self.model.sp))
                mask = mb["attention_mask"][:, -response_length:].to(out.log_probs.device).bool()
                check_tensor("log-prob", out.log_probs[mask], mb, type(self).__name__)
                for name, values in parts.items():
                    value = getattr(out, name)
                    if value is not None:
                        values.append(value if name == "routed_experts" else value.float().cpu())
        wanted = {"log_probs": True, "entropy": with_entropy, "sum_pi_squared": with_sum_pi_squared,
                  "routed_experts": capture_routes}
        return ForwardOut(**{name: in_row_order(values, order) if wanted[name] else None
                             for name, values in parts.items()})


class ActorWorker(_PolicyScorer, TrainableModelRole):
    """The trained policy. `update_actor` runs the shared update loop with the registered policy loss."""

    def __init__(self, actor: ActorConfig, model: ModelConfig, *, total_steps: int, rollout_n: int,
                 temperature: float, seed: int, rollout_correction: RolloutCorrection | None = None,
                 log_prob: MicroBatching | None = None, distillation: DistillationLossConfig | None = None,
                 sum_pi_squared: bool = False) -> None:
        """`actor`: actor_rollout_ref.actor; `model`: actor_rollout_ref.model with `path` resolved to a local
        folder. `total_steps` sizes the LR schedule; `rollout_n` (samples per prompt) turns
        ppo_mini_batch_size prompts into rows; `temperature` is the rollout's; `seed` seeds the init and the
        epoch shuffles; `rollout_correction` weighs the policy-gradient loss against the engine's
        `rollout_log_probs` (algorithm.rollout_is / rollout_rs: importance weights, rejection; None = off);
        `log_prob`: the micro-batching of the old-log-prob pass (actor_rollout_ref.rollout.log_prob_*, also the
        LoRA reference's, as in verl; None = the update's); `distillation`: the distillation loss against the
        batch's `teacher_log_probs` (distillation.distillation_loss; None = off); `sum_pi_squared`: the old-log-prob
        pass also returns sum_v pi_v^2 per token (the run's estimator declares `@needs(sum_pi_squared=True)`)."""
        super().__init__()
        self.actor, self.model_cfg, self.total_steps = actor, model, total_steps
        self.checkpoint_contents = actor.checkpoint
        self.rollout_n, self.temperature, self.seed = rollout_n, temperature, seed
        self.rollout_correction = rollout_correction
        self.is_scale = 1.0  # the batch mean of the IS weights, set per update (rlkit.workers.is_batch_norm)
        self.update_micro = MicroBatching(actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz,
                                          actor.ppo_max_token_len_per_gpu)
        self.log_prob = log_prob or self.update_micro
        self.logits_chunk_size = actor.logits_chunk_size
        self.router_replay, self.router_replay_from = actor.router_replay, actor.router_replay_from
        self.distillation = distillation
        self.sum_pi_squared = sum_pi_squared

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        start = time.perf_counter()
        self.init_distributed()
        torch.manual_seed(self.seed)
        self.model = FSDPModel(
            self.model_cfg.path,
            self.actor.fsdp_config,
            self.device,
            gradient_checkpointing=self.model_cfg.enable_gradient_checkpointing,
            attn_implementation=self.model_cfg.attn_implementation,
            trust_remote_code=self.model_cfg.trust_remote_code,
            config_overrides=self.model_cfg.override_config,
            lora=self.model_cfg,
            ulysses_sequence_parallel_size=self.actor.ulysses_sequence_parallel_size,
            compile_layers=self.model_cfg.use_torch_compile,
            fused_lm_head=self.model_cfg.fused_lm_head,
            freeze_vision=self.actor.freeze_vision_tower,
        )
        self.model.setup_optimizer(self.actor.optim, self.total_steps)
        self.router_tap = self.model.router_tap  # None for a dense model
        if self.router_replay and self.router_tap is None:
            raise UserError("actor_rollout_ref.actor.router_replay=true needs a mixture-of-experts model; "
                            f"{self.model_cfg.path} has no router: set router_replay=false")
        coef = self.actor.router_aux_loss_coef
        if coef is None:
            coef = getattr(getattr(self.model.module, "config", None), "router_aux_loss_coef", 0.0)
        self.router_aux_coef = float(coef or 0.0) if self.router_tap is not None else 0.0
        return {"init_s": time.perf_counter() - start, **self.model.memory_report()}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def memory_report(self) -> dict[str, float]:
        """Parameters (all / trained) and this rank's optimizer-state and gradient sizes (the run summary)."""
        return self.model.memory_report()

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch) -> Batch:
        maybe_break("actor.compute_log_prob")
        capture = self.router_replay and self.router_replay_from == "old_log_prob"  # verl's R2
        out = self._log_probs(batch, self.log_prob, with_entropy=True, with_sum_pi_squared=self.sum_pi_squared,
                              capture_routes=capture)
        mask = batch["response_mask"].float()
        tensors = {"old_log_probs": out.log_probs, "entropys": out.entropy}
        for name in ("sum_pi_squared", "routed_experts"):
            if getattr(out, name) is not None:
                tensors[name] = getattr(out, name)
        return Batch(tensors, meta={"metrics": {"actor/entropy": float(masked_mean(out.entropy, mask))}})

    @register(dispatch=Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch) -> Batch:
        """PPO update; if `old_log_probs` is absent (on-policy, one pass) the first forward supplies it."""
        maybe_break("actor.update_policy")
        a = self.actor
        plan = UpdatePlan(
            epochs=a.ppo_epochs, mini_batch_rows=max(1, a.ppo_mini_batch_size * self.rollout_n // self.world_size),
            micro=self.update_micro, loss_agg_mode=a.loss_agg_mode, grad_clip=a.grad_clip,
            shuffle_seed=self.seed + self.rank if a.shuffle else None,
            optimizer_offload=a.fsdp_config.optimizer_offload,
        )
        self.is_scale = batch_is_scale(self.rollout_correction, batch)  # algorithm.rollout_is_batch_normalize
        metrics = self.run_update(batch, plan, self._policy_loss(batch["responses"].shape[1]), "actor")
        return Batch(meta={"metrics": metrics})

    def _policy_loss(self, response_length: int) -> MicroLoss:
        """The actor's micro-batch loss: the registered policy loss, minus the entropy bonus, plus the KL loss."""
        a = self.actor
        pg_loss_fn = POLICY_LOSSES.get(a.policy_loss)
        kl_fn = KL_ESTIMATORS.get(a.kl_loss_type) if a.use_kl_loss else None
        params = {name: getattr(a, name) for name in LOSS_PARAMS}

        def loss_fn(mb: Batch) -> tuple[torch.Tensor, dict[str, float]]:
            metrics: dict[str, float] = {}
            mask = mb["response_mask"].float().to(self.device)
            tap = self.router_tap
            student_topk = None
            with tap.recording() if tap is not None else contextlib.nullcontext():
                if "teacher_topk_ids" in mb:  # forward_kl_topk: the full distribution at the teacher's ids
                    out, student_topk = self._topk_forward(mb, response_length, a.entropy_coeff != 0)
                else:
                    out = self._forward(mb, response_length, with_entropy=a.entropy_coeff != 0)
            lp = out.log_probs
            check_tensor("log-prob", lp[mask.bool()], mb, "actor update")
            watch_gradient(lp, mb)  # --debug nan: a NaN the loss sends back starts on this rank (FSDP spreads it)
            old = mb["old_log_probs"].to(self.device) if "old_log_probs" in mb else lp.detach()
            is_weights = None
            if self.rollout_correction is not None:
                if "rollout_log_probs" not in mb:
                    raise RuntimeError("algorithm.rollout_is/rollout_rs is on but the batch has no "
                                       "rollout_log_probs (rollout.calculate_log_probs: the engine returned none)")
                rc = self.rollout_correction  # bypass_mode: old is the engine's; the gap is the current policy's
                corr = rc(lp.detach() if rc.bypass else old, mb["rollout_log_probs"].to(self.device), mask,
                          self.is_scale)
                is_weights = corr.weights
                metrics.update(corr.metrics)
            pg = pg_loss_fn(
                old, lp, mb["advantages"].to(self.device), mask,
                **params, rollout_is_weights=is_weights,
                ref_log_prob=mb["ref_log_prob"].to(self.device) if "ref_log_prob" in mb else None,  # @needs(ref)
            )
            task = self.distillation is None or self.distillation.use_task_rewards
            loss = pg["pg_loss"] if task else torch.zeros((), device=self.device)
            if self.distillation is not None:
                loss = loss + self._distill_term(mb, lp, old, mask, student_topk, metrics)
            if a.entropy_coeff != 0:
                ent_loss = agg_loss(out.entropy, mask, a.loss_agg_mode)
                loss = loss - a.entropy_coeff * ent_loss
                metrics["actor/entropy_loss"] = float(ent_loss.detach())
            if kl_fn is not None:
                kl_loss = agg_loss(kl_fn(lp, mb["ref_log_prob"].to(self.device)), mask, a.loss_agg_mode)
                loss = loss + a.kl_loss_coef * kl_loss
                metrics["actor/kl_loss"] = float(kl_loss.detach())
            if tap is not None:  # MoE: load balancing (its weight may be 0: then only logged) and expert load
                aux = tap.load_balancing_loss()
                loss = loss + self.router_aux_coef * aux
                metrics["actor/router_aux_loss"] = float(aux.detach())
                metrics.update(tap.load_metrics())
            metrics["actor/pg_loss"] = float(pg["pg_loss"].detach())
            for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
                metrics[f"actor/{key}"] = float(pg[key])
            return loss, metrics

        return loss_fn

    def _topk_forward(self, mb: Batch, response_length: int, with_entropy: bool) -> tuple[ForwardOut, torch.Tensor]:
        """The student's log-probs of the sampled tokens and at the teacher's top-k ids (B, R, K), with grad,
        from one padded forward of the full distribution (rlkit/workers/topk.py)."""
        with self.model.computing():
            logp = response_log_softmax(self.model.module, mb["input_ids"].to(self.device),
                                        mb["attention_mask"].to(self.device), mb["position_ids"].to(self.device),
                                        response_length, self.temperature)
        lp = logp.gather(-1, mb["responses"].to(self.device).unsqueeze(-1)).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1) if with_entropy else None
        return ForwardOut(lp, ent), logp.gather(-1, mb["teacher_topk_ids"].to(self.device))

    def _distill_term(self, mb: Batch, lp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor,
                      student_topk: torch.Tensor | None, metrics: dict[str, float]) -> torch.Tensor:
        """The distillation loss over the tokens the teacher scored: a direct loss term, or (use_policy_gradient)
        a policy loss whose per-token advantage is -coef * the loss (docs/distillation.md)."""
        d, a = self.distillation, self.actor
        assert d is not None
        tmask = mask * mb["teacher_mask"].to(self.device)
        topk = mb["teacher_topk_log_probs"].to(self.device) if student_topk is not None else None
        per_token = distill_loss(d.loss_mode, DistillInputs(lp, mb["teacher_log_probs"].to(self.device), student_topk,
                                                            topk),
                                 log_prob_min=d.log_prob_min_clamp, loss_max=d.loss_max_clamp)
        value = agg_loss(per_token, tmask, a.loss_agg_mode)
        metrics["actor/distill_loss"] = float(value.detach())
        if not d.use_policy_gradient:
            return d.distillation_loss_coef * value
        adv = -d.distillation_loss_coef * per_token.detach() * tmask
        pg = POLICY_LOSSES.get(d.policy_loss_mode)(
            old, lp, adv, tmask, clip_ratio_low=d.clip_ratio_low, clip_ratio_high=d.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c, loss_agg_mode=a.loss_agg_mode, rollout_is_weights=None, ref_log_prob=None,
        )
        metrics["actor/distill_pg_loss"] = float(pg["pg_loss"].detach())
        return pg["pg_loss"]

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """LoRA: the reference policy's log-probs are the base model's, i.e. this model with the adapter off."""
        maybe_break("ref.compute_log_prob")
        if self.model.lora is None:
            raise RuntimeError("compute_ref_log_prob on the actor needs LoRA (full fine-tuning has a reference worker)")
        with self.model.lora.disabled():
            lp = self._log_probs(batch, self.log_prob, False).log_probs
        return Batch({"ref_log_prob": lp})

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Rank 0 gets the full weights (for export and tests); other ranks take part and get None."""
        state = self.model.full_state_dict()
        return state if self.rank == 0 else None

    # --------------------------------------------- weights to separate engines by broadcast
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def weight_group_address(self) -> tuple[str, int] | None:
        """Rank 0: its node's address and a port it holds for the weight group's store (None on other ranks)."""
        from rlkit.controller.worker import node_ip, reserve_master_port

        if self.rank != 0:
            return None
        addr = node_ip()
        return addr, reserve_master_port(addr)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def open_weight_group(self, addr: str, port: int, world: int) -> None:
        """Rank 0 joins the weight broadcast group as its sender (rlkit/workers/weight_broadcast.py)."""
        from rlkit.controller.worker import DEFAULT_DIST_TIMEOUT_S
        from rlkit.workers.weight_broadcast import WeightGroup

        if self.rank == 0:
            self.weight_group = WeightGroup.join(addr, port, 0, world, self.device, DEFAULT_DIST_TIMEOUT_S)

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def broadcast_weights(self, bucket_bytes: int) -> dict[str, float]:
        """Every rank gathers the full parameters (a collective); rank 0 broadcasts them to the engines."""
        start = time.perf_counter()
        named = self.model.iter_full_params()
        if self.rank != 0:
            for _ in named:
                pass
            return {}
        out = self.weight_group.send(named, bucket_bytes)
        return {**out, "timing_s/weight_broadcast": time.perf_counter() - start}

    def adapter_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """LoRA: (peft config, the adapter's tensors under PEFT's file names), gathered on every rank
        (a collective), for an engine that loads the adapter natively (rollout.lora_sync=native)."""
        from rlkit.models.lora import adapter_state_dict

        assert self.model.lora is not None
        return self.model.lora.config.to_dict(), adapter_state_dict(self.model.iter_wrapped_params(adapter_only=True))


class RefWorker(_PolicyScorer):
    """The frozen reference policy (only created when a KL term needs it)."""

    def __init__(self, ref: RefConfig, model: ModelConfig, *, temperature: float, logits_chunk_size: int) -> None:
        """`ref`: actor_rollout_ref.ref; `model`: the policy's model section (`path` a local folder); its
        log-probs use the rollout's `temperature` and the actor's `logits_chunk_size`, as the actor's do."""
        super().__init__()
        self.ref, self.model_cfg = ref, model
        self.temperature, self.logits_chunk_size = temperature, logits_chunk_size

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_distributed()
        frozen = dataclasses.replace(self.ref.fsdp_config, dither_master_weights=False)  # never updated: no dither
        self.model = FSDPModel(
            self.model_cfg.path, frozen, self.device,
            attn_implementation=self.model_cfg.attn_implementation, trust_remote_code=self.model_cfg.trust_remote_code,
            config_overrides=self.model_cfg.override_config,
            ulysses_sequence_parallel_size=self.ref.ulysses_sequence_parallel_size,
            compile_layers=self.model_cfg.use_torch_compile, fused_lm_head=self.model_cfg.fused_lm_head,
        )
        for p in self.model.module.parameters():
            p.requires_grad_(False)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        maybe_break("ref.compute_log_prob")
        ref = self.ref  # its nulls settled by finalize (rlkit/config/micro_batch_sizes.py)
        micro = MicroBatching(ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_use_dynamic_bsz,
                              ref.log_prob_max_token_len_per_gpu)
        lp = self._log_probs(batch, micro, False).log_probs
        return Batch({"ref_log_prob": lp})
