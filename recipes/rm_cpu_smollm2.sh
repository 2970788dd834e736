#!/usr/bin/env bash
# CPU recipe: GRPO on GSM8K, SmolLM2-135M policy, rule reward + Skywork-Reward-V2-Qwen3-0.6B (classifier RM).
# Hardware: 2-4 CPU cores, ~8 GiB RAM, no GPU; needs the hub once (the RM, ~1.2 GB). Check the RM on a few rows
# first: rlkit reward score rows.jsonl --reward-model Skywork/Skywork-Reward-V2-Qwen3-0.6B
# Extra arguments are passed to `rlkit train` as overrides, e.g. trainer.total_training_steps=4.
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
DATA=${RLKIT_DATA_DIR:-$HOME/data/gsm8k}
if [[ ! -f "$DATA/train.parquet" || ! -f "$DATA/test.parquet" ]]; then
  "$RLKIT" data gsm8k --out "$DATA"
fi
"$RLKIT" model pull smollm2-135m-instruct
"$RLKIT" model pull Skywork/Skywork-Reward-V2-Qwen3-0.6B
"$RLKIT" train grpo --config recipes/rm_cpu_smollm2.yaml \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" "$@"
