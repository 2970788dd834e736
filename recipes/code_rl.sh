#!/usr/bin/env bash
# GRPO on the code set (pass fraction of unit tests in the sandbox); see code_rl.yaml.
# Extra arguments are config overrides (key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
DATA=${RLKIT_DATA_DIR:-$HOME/data/code}
if [[ ! -f "$DATA/train.parquet" ]]; then
  "$RLKIT" data code --out "$DATA"
fi
"$RLKIT" train grpo --config recipes/code_rl.yaml \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" "$@"
