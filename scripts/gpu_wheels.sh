#!/usr/bin/env bash
# The wheels `bench/gpu_check.py --host inprocess` needs on the lent GPU machine that its image lacks (docs/gpu.md):
# Hydra's config stack (hydra-core, omegaconf, antlr4-python3-runtime) and rlkit itself, for CPython 3.12 on
# manylinux x86_64 (all pure Python), into the git-ignored folder .whl/ (carried by the device tool's `carry`).
# Ray and vLLM stay behind: the in-process host imports neither. Prints the total; it must stay under 64 MiB.
#
#   scripts/gpu_wheels.sh            # -> .whl/*.whl and "total: N bytes"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${GPU_WHEELS_DIR:-.whl}
# the versions this checkout runs with (one of each: two versions stop the install there)
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
HYDRA=$(version hydra-core)
OMEGACONF=$(version omegaconf)
ANTLR=$(version antlr4-python3-runtime)

rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" "hydra-core==$HYDRA" "omegaconf==$OMEGACONF"
# antlr4-python3-runtime 4.9.x is published as a source archive only: build its (pure Python) wheel here
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "antlr4-python3-runtime==$ANTLR"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" .
ls -l "$OUT"
total=$(du -cb "$OUT"/*.whl | tail -1 | cut -f1)
echo "total: $total bytes ($((total / 1024)) KiB) in $OUT"
if [ "$total" -ge $((64 * 1024 * 1024)) ]; then
    echo "over the 64 MiB a device call carries" >&2
    exit 1
fi
