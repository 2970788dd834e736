#!/usr/bin/env bash
# GRPO on GSM8K for Qwen3-30B-A3B (mixture of experts: 30.5B parameters, 3.3B active per token, 128 experts,
# top-8) on one node of 8 x 80 GB GPUs. Needs CUDA torch 2.13 + vllm. Not run by us yet (no GPU in the
# sessions that built the MoE path); the CPU path it relies on is tested (tests/hybrid/test_moe_hybrid.py).
#
# Memory per GPU, worked out (bf16 = 2 bytes, fp32 = 4):
#   actor, FSDP2 over 8 ranks: bf16 compute params are gathered one decoder layer at a time; each rank keeps
#     its shard of the fp32 master weights 30.5B * 4 / 8 = 15.3 GB, grads 15.3 GB, AdamW moments 30.5 GB
#     -> ~61 GB, too much beside the engine: optimizer_offload=true moves the 30.5 GB of moments to host RAM
#     (30.5B * 8 bytes = 244 GB on the node), leaving ~31 GB + activations (gradient checkpointing on).
#   reference: none (use_kl_loss=false, as common for GRPO on MoE); with KL on, a bf16 ref adds 7.6 GB/GPU
#     sharded, or use param_offload for it.
#   vLLM, TP=4 (two engines of 4 GPUs): bf16 weights 61 GB / 4 = 15.3 GB per GPU + KV cache; the engine sleeps
#     (level 1: KV dropped, weights kept) while the actor trains, so gpu_memory_utilization=0.5 (40 GB) holds
#     weights + ~24 GB of KV.
#   peak: ~31 GB (actor) + ~15 GB (sleeping engine weights) + activations: fits 80 GB.
# The weight sync streams the actor's fused experts through rlkit/models/weight_layout.py into vLLM's
# per-expert names; a missed tensor stops the run. Expert parallelism in vLLM (enable_expert_parallel) and
# FSDP x EP for training are not exposed yet (docs/moe.md).
# Expected (not measured by us): GSM8K val accuracy rising from ~0.85 (the instruct model's) within an epoch;
# rollout/log_prob_abs_diff (with rollout.calculate_log_probs=true) larger than for a dense model because
# bf16 routing flips experts near ties (routing replay is future work, docs/moe.md).
set -euo pipefail
N_GPUS=${N_GPUS:-8}
TP=${TP:-4}
rlkit data gsm8k --out ~/data/gsm8k
rlkit train grpo \
  data.train_files=~/data/gsm8k/train.parquet data.val_files=~/data/gsm8k/test.parquet \
  data.train_batch_size=128 data.max_prompt_length=512 data.max_response_length=1024 \
  actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.actor.router_aux_loss_coef=0.001 \
  actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16 \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=true \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.dtype=bfloat16 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.5 actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  trainer.n_gpus_per_node="$N_GPUS" trainer.device=cuda \
  trainer.total_epochs=1 trainer.test_freq=10 trainer.save_freq=20 \
  trainer.logger=[console,file,tensorboard] \
  trainer.project_name=gsm8k trainer.experiment_name=qwen3_30b_a3b_grpo "$@"
