#!/usr/bin/env bash
# Run the whole test suite (CPU only), in two phases:
#   1. every test but the serial ones, on two pytest processes (pytest-xdist, one test file per process at a time:
#      most tests wait on a single-threaded step - a Ray call, a vLLM engine start, a subprocess - so two processes
#      keep both cores busy);
#   2. the serial ones (they bind the machine's default Ray ports as `rlkit cluster up` does), alone.
# RLKIT_TEST_MARK narrows both phases (e.g. "not slow"); extra arguments go to both pytest runs.
# Exit 5 from pytest (nothing collected) counts as failure in phase 1, and so does a skipped test whose reason is not
# listed in tests/allowed_skips.txt (tests/skip_guard.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check . || exit 1
mark=${RLKIT_TEST_MARK:-}
workers=${RLKIT_TEST_WORKERS:-2}
.venv/bin/python -m pytest -q -rs --durations=15 -n "$workers" --dist loadfile -m "not serial${mark:+ and ($mark)}" "$@"
rc=$?
if [[ $rc -eq 5 ]]; then echo "test: pytest collected no tests" >&2; exit 1; fi
.venv/bin/python -m pytest -q -rs --durations=5 -m "serial${mark:+ and ($mark)}" "$@"
rc2=$?
[[ $rc2 -eq 5 ]] && rc2=0  # a mark that selects no serial test
if [[ $rc -ne 0 ]]; then exit $rc; fi
exit $rc2
