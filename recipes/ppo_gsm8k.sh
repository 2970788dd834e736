#!/usr/bin/env bash
# PPO (GAE, learned critic) on GSM8K. Default: the CPU-sized SmolLM2 model for a short smoke run;
# on a GPU node pass e.g. actor_rollout_ref.model.path=Qwen/Qwen3-0.6B trainer.n_gpus_per_node=8 trainer.device=cuda.
# Expected on CPU: runs end to end (~1 min/step); value loss falls over the first steps.
set -euo pipefail
cd "$(dirname "$0")/.."  # --config recipes/... resolves from any directory
rlkit data gsm8k --out ~/data/gsm8k 2>/dev/null || true
rlkit train ppo --config recipes/gsm8k_cpu_quickstart.yaml \
  actor_rollout_ref.rollout.n=1 data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  critic.optim.lr=1e-5 trainer.experiment_name=smollm2_gsm8k_ppo "$@"
