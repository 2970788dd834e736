#!/usr/bin/env bash
# Coder + unit-tester co-evolution on the code set; see coevolve_code.yaml and docs/agents.md.
# Extra arguments are config overrides (key=value).
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
DATA=${RLKIT_DATA_DIR:-$HOME/data/code_coevolve}
if [[ ! -f "$DATA/train.parquet" ]]; then
  "$RLKIT" data code --coevolve --out "$DATA"
fi
"$RLKIT" train grpo --config recipes/coevolve_code.yaml \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" "$@"
