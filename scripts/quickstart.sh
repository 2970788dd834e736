#!/usr/bin/env bash
# The README's main job: GRPO on GSM8K with the default 135M model on this CPU (recipes/quickstart_cpu.sh), then the
# run's reward and validation curves above its before/after table (`rlkit show RUN --summary`).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
RLKIT=${RLKIT:-.venv/bin/rlkit}
run_dir=checkpoints/quickstart  # recipes/gsm8k_cpu_quickstart.yaml's trainer.default_local_dir, unless overridden
for arg in "$@"; do
  [[ "$arg" == trainer.default_local_dir=* ]] && run_dir=${arg#trainer.default_local_dir=}
done
bash recipes/quickstart_cpu.sh "$@"
echo
"$RLKIT" show "$run_dir" --summary
