"""The local teachers of on-policy distillation: frozen FSDP2 models that score the student's samples.

One role holds every local teacher of the run (`distillation.teacher_models`, each its own model); the driver
(rlkit/trainer/step/teacher_stage.py) sends each teacher its rows, already in the teacher's tokens when its tokenizer
differs from the student's, and names the teacher in the call. Like the reference, it is colocated with the
actor (one more role of the trainer processes) unless `distillation.nnodes` gives it a group of its own.
"""

from __future__ import annotations

import dataclasses

import torch

from rlkit.config.distillation import TeacherModelConfig
from rlkit.config.schema import ModelConfig, RefConfig
from rlkit.controller import Dispatch, register
from rlkit.debug import maybe_break
from rlkit.models.context import declares_experts
from rlkit.protocol import Batch
from rlkit.workers.actor import FORWARD_KEYS, _PolicyScorer
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.micro_batch import MicroBatching, in_row_order
from rlkit.workers.topk import response_log_softmax


class TeacherWorker(_PolicyScorer):
    """Frozen teachers by name; `compute_teacher_log_prob` scores the sampled tokens (and the top-k)."""

    def __init__(self, teachers: dict[str, TeacherModelConfig], ref: RefConfig, model: ModelConfig, *,
                 temperature: float, logits_chunk_size: int, topk: int | None) -> None:
        """`teachers`: name -> teacher with `model_path` a local folder; `ref`: the reference's section (the
        teachers are frozen as it is: its FSDP settings and micro-batching); `model`: the policy's model section
        (forward options); `temperature`: the rollout's; `topk`: also return the teacher's top-k (forward_kl_topk)."""
        super().__init__()
        self.teachers, self.ref, self.policy_model = teachers, ref, model
        self.temperature, self.logits_chunk_size, self.topk = temperature, logits_chunk_size, topk
        self.models: dict[str, FSDPModel] = {}

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, float]:
        self.init_distributed()
        frozen = dataclasses.replace(self.ref.fsdp_config, dither_master_weights=False)
        for name, t in self.teachers.items():
            # a dense teacher of an expert-parallel student: nothing to split (an MoE one splits as the reference)
            ep = frozen.expert_parallel_size if declares_experts(t.model_path) else 1
            model = FSDPModel(str(t.model_path), dataclasses.replace(frozen, expert_parallel_size=ep), self.device,
                              attn_implementation=self.policy_model.attn_implementation,
                              trust_remote_code=t.trust_remote_code)
            for p in model.module.parameters():
                p.requires_grad_(False)
            self.models[name] = model
        return {f"teacher/{name}/params_m": sum(p.numel() for p in m.module.parameters()) / 1e6
                for name, m in self.models.items()}

    def _use(self, name: str) -> None:
        """Point the shared scorer (`_PolicyScorer`) at teacher `name`."""
        self.model = self.models[name]
        self.model_cfg = dataclasses.replace(self.policy_model, path=str(self.teachers[name].model_path))

    @register(dispatch=Dispatch.DP_COMPUTE)
    def compute_teacher_log_prob(self, batch: Batch, teacher: str) -> Batch:
        """`teacher_log_probs` (B, R) of the batch's response tokens under `teacher`; with top-k on, also
        `teacher_topk_ids` / `teacher_topk_log_probs` (B, R, K)."""
        maybe_break("teacher.compute_log_prob")
        self._use(teacher)
        ref = self.ref
        micro = MicroBatching(ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_use_dynamic_bsz,
                              ref.log_prob_max_token_len_per_gpu)
        if self.topk is None:
            lp = self._log_probs(batch, micro, False).log_probs
            return Batch({"teacher_log_probs": lp})
        return self._with_topk(batch, micro, self.topk)

    def _with_topk(self, batch: Batch, micro: MicroBatching, k: int) -> Batch:
        response_length = batch["responses"].shape[1]
        lps, ids, tops = [], [], []
        self.model.module.eval()
        with torch.no_grad():
            micros, order = micro.split(batch.select(FORWARD_KEYS))
            for mb in micros:
                with self.model.computing():
                    logp = response_log_softmax(self.model.module, mb["input_ids"].to(self.device),
                                                mb["attention_mask"].to(self.device),
                                                mb["position_ids"].to(self.device), response_length, self.temperature)
                lps.append(logp.gather(-1, mb["responses"].to(self.device).unsqueeze(-1)).squeeze(-1).cpu())
                top = logp.topk(min(k, logp.shape[-1]), dim=-1)
                tops.append(top.values.cpu())
                ids.append(top.indices.cpu())
        return Batch({"teacher_log_probs": in_row_order(lps, order), "teacher_topk_ids": in_row_order(ids, order),
                      "teacher_topk_log_probs": in_row_order(tops, order)})
