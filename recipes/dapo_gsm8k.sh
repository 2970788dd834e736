#!/usr/bin/env bash
# DAPO (clip-higher, token-level loss, dynamic sampling, overlong shaping) on GSM8K.
# Default: CPU-sized model for a smoke run; on GPUs raise batch/n/lengths and set trainer.device=cuda.
# Expected: groups with identical rewards are dropped and refilled (see dapo/kept_groups in the logs).
set -euo pipefail
cd "$(dirname "$0")/.."  # --config recipes/... resolves from any directory
rlkit data gsm8k --out ~/data/gsm8k 2>/dev/null || true
rlkit train dapo --config recipes/gsm8k_cpu_quickstart.yaml \
  actor_rollout_ref.rollout.n=4 algorithm.filter_groups.max_num_gen_batches=4 \
  reward_model.overlong_buffer.len=32 trainer.experiment_name=smollm2_gsm8k_dapo "$@"
