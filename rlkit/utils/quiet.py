"""Third-party console noise, hidden unless RLKIT_VERBOSE=1.

On a CPU box a run otherwise opens with dozens of lines nobody can act on: vLLM's INFO/WARNING
lines (Triton "not installed / no CPU backend", LD_PRELOAD advice, the engine config dump),
c10 warnings printed from C++ ("NUMA binding: Using MEMBIND policy..."), FutureWarnings from
torch internals that vLLM triggers, and a weight-loading bar per engine and per worker. They
drown the progress bar and the metrics table. All of them are controlled by environment
variables read when the libraries load, so the same settings go to this process (`quiet_process`,
called by the CLI before torch/vLLM are imported) and to every Ray worker (`worker_env`).
A variable the user set keeps the user's value; RLKIT_VERBOSE=1 shows everything.
"""

from __future__ import annotations

import logging
import os
import warnings

VERBOSE_ENV = "RLKIT_VERBOSE"
_OFF = ("", "0", "false", "no", "off")

#: read at import time by the libraries; set in this process and in workers when not verbose
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # vLLM's INFO/WARNING lines (Triton, LD_PRELOAD, config dump)
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10 warnings printed by C++ code (NUMA binding)
}
#: only where no progress bar is wanted: Ray workers (their bars arrive as garbled log lines) and `rlkit eval`
QUIET_BARS_ENV = {
    "TQDM_DISABLE": "1",  # tqdm's default for every bar not explicitly enabled
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' weight-loading bars
}
#: worker processes start with these warning filters (a running process gets `warnings.filterwarnings`)
QUIET_WARNINGS = "ignore::FutureWarning"
#: loggers that warn at import time, before their library configures its level from the env
QUIET_LOGGERS = ("vllm",)
VERBOSE_ONLY = {"VLLM_LOGGING_LEVEL": "INFO"}


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in _OFF


def worker_env() -> dict[str, str]:
    """Env vars for Ray workers' runtime_env (the user's own values win)."""
    if verbose():
        return {k: os.environ.get(k, v) for k, v in VERBOSE_ONLY.items()}
    env = {**QUIET_ENV, **QUIET_BARS_ENV, "PYTHONWARNINGS": QUIET_WARNINGS}
    return {k: os.environ.get(k, v) for k, v in env.items()}


def quiet_process(bars: bool = False) -> None:
    """Apply the quiet settings to this process; call before torch/vLLM are imported (the CLI, and
    `prepare_vllm_env` in every process that builds an engine).

    `bars=True` also turns off third-party progress bars (commands that draw their own).
    """
    if verbose():
        return
    for key, value in {**QUIET_ENV, **(QUIET_BARS_ENV if bars else {})}.items():
        os.environ.setdefault(key, value)
    if not os.environ.get("PYTHONWARNINGS"):
        warnings.filterwarnings("ignore", category=FutureWarning)
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            level = logging.getLevelName(os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper())
            logger.setLevel(level if isinstance(level, int) else logging.ERROR)


def use_load_bars() -> bool:
    """Whether engines should draw their weight-loading bars (explicit tqdm flags ignore TQDM_DISABLE)."""
    return verbose()
