#!/usr/bin/env bash
# CPU quickstart (what `make quickstart` runs after set-up): data -> model -> GRPO -> summary.
# Hardware: 2 CPU cores, no GPU, no model hub needed. Expected (float32, measured): ~11 min; training reward 0.03 -> 0.13,
# test score 0.025 -> 0.225. bf16 (CPUs with AMX / AVX512-BF16): per seed in bench/results/learning_precision.md.
# Extra arguments are passed to `rlkit train` as overrides, e.g. trainer.total_training_steps=4.
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
DATA=${RLKIT_DATA_DIR:-$HOME/data/gsm8k}
if [[ ! -f "$DATA/train.parquet" || ! -f "$DATA/test.parquet" ]]; then
  "$RLKIT" data gsm8k --out "$DATA"
fi
"$RLKIT" model pull smollm2-135m-instruct
"$RLKIT" train grpo --config recipes/gsm8k_cpu_quickstart.yaml \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" "$@"
