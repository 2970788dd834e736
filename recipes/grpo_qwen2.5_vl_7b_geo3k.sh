#!/usr/bin/env bash
# GRPO on Geometry3K for Qwen2.5-VL-7B-Instruct on one GPU node, verl's geo3k layout (images + <image> in the
# problem, boxed answers, verl's key names and values). Not run by us (no GPU here): see docs/vlm.md.
# Hardware: 1 node x 8 GPUs (>= 80 GB each). Needs CUDA torch 2.13 + torchvision. Rollout: hf, since rlkit's
# vLLM backend does not pass images yet (docs/vlm.md "vLLM"); expect generation to dominate the step.
# Data: a local copy of hiyouga/geometry3k in its published layout (data/train-*.parquet, ...) in GEO3K_SRC.
set -euo pipefail
N_GPUS=${N_GPUS:-8}
GEO3K_SRC=${GEO3K_SRC:?set GEO3K_SRC to a local copy of hiyouga/geometry3k}
rlkit data geo3k --source "$GEO3K_SRC" --out ~/data/geo3k
rlkit train grpo \
  data.train_files=~/data/geo3k/train.parquet data.val_files=~/data/geo3k/test.parquet \
  data.train_batch_size=512 data.max_prompt_length=1024 data.max_response_length=2048 \
  data.filter_overlong_prompts=true data.truncation=error data.image_key=images \
  data.mm_processor_kwargs='{min_pixels: 3136, max_pixels: 1003520}' \
  actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.freeze_vision_tower=false \
  actor_rollout_ref.actor.ppo_mini_batch_size=128 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10 \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.01 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16 \
  actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.dtype=bfloat16 actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20 \
  algorithm.use_kl_in_reward=false \
  trainer.n_gpus_per_node="$N_GPUS" trainer.device=cuda \
  trainer.total_epochs=15 trainer.test_freq=5 trainer.save_freq=20 \
  trainer.logger=[console,file,tensorboard] \
  trainer.project_name=geo3k trainer.experiment_name=qwen2_5_vl_7b_grpo "$@"
