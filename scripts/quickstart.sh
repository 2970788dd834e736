#!/usr/bin/env bash
# The README's main job: GRPO on GSM8K with the default 135M model on this CPU (recipes/quickstart_cpu.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
exec bash recipes/quickstart_cpu.sh "$@"
