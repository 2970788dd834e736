#!/usr/bin/env bash
# CPU quickstart, LoRA variant: the same GRPO-on-GSM8K run as recipes/quickstart_cpu.sh, training a
# rank-16 LoRA adapter (all linear layers) on SmolLM2-135M-Instruct instead of all its weights.
# Hardware: 2 CPU cores, ~4 GiB RAM, no GPU. Expected (not measured end to end yet): a step no slower than
# full fine-tuning (bench/lora.py measured the actor step on this model), the training reward rising as in
# the full run (the format bonus first), and a run summary that shows the trained parameters (~3.6% of the
# model at rank 16) and the optimizer state (~25x smaller than full fine-tuning's).
# The LoRA learning rate is ~100x the full-fine-tuning one (1e-3 vs 1e-5): the adapter starts at zero.
# After the run: `rlkit export checkpoints/quickstart_lora OUT` (merged model) or `... --adapter-only`
# (a PEFT adapter folder; `rlkit eval OUT --data ...` takes either). Extra arguments go to `rlkit train`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash recipes/quickstart_cpu.sh \
  actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.lora_alpha=32 \
  actor_rollout_ref.model.target_modules=all-linear \
  actor_rollout_ref.actor.optim.lr=1e-3 \
  trainer.experiment_name=smollm2_gsm8k_grpo_lora trainer.default_local_dir=checkpoints/quickstart_lora "$@"
