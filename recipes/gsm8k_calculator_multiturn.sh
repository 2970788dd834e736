#!/usr/bin/env bash
# Multi-turn GRPO on GSM8K with the calculator tool; see gsm8k_calculator_multiturn.yaml for hardware,
# expectations and the GPU variant. Extra arguments are config overrides (key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
DATA=${RLKIT_DATA_DIR:-$HOME/data/gsm8k}
if [[ ! -f "$DATA/train.parquet" ]]; then
  "$RLKIT" data gsm8k --out "$DATA"
fi
"$RLKIT" train grpo --config recipes/gsm8k_calculator_multiturn.yaml \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" "$@"
