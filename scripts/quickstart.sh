#!/usr/bin/env bash
# The README's main job. For now: a short demo of the runtime on real Ray workers.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
.venv/bin/python -m rlkit.controller.demo
