#!/usr/bin/env bash
# Run the whole test suite (CPU only). Exit 5 from pytest (nothing collected) counts as failure, and so
# does a skipped test whose reason is not listed in tests/allowed_skips.txt (tests/skip_guard.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check . || exit 1
.venv/bin/python -m pytest -q -rs --durations=15 "$@"
rc=$?
if [[ $rc -eq 5 ]]; then echo "test: pytest collected no tests" >&2; exit 1; fi
exit $rc
