"""The environment vLLM must see before it is imported, shared by every process that builds an engine
(the rollout engine, the generative judge's engine, benchmarks)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def prepare_vllm_env() -> None:
    """Environment vLLM must see before it is imported: engine in this process, caches in a temp dir.

    Only sets variables that are unset, so a user's choice wins.
    """
    from rlkit.utils.quiet import quiet_process

    quiet_process()  # vLLM warns at import time (Triton on CPU...); RLKIT_VERBOSE=1 keeps it
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if "VLLM_CACHE_ROOT" in os.environ and "VLLM_RPC_BASE_PATH" in os.environ:
        return
    tmp = tempfile.mkdtemp(prefix="rlkit-vllm-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(tmp, "cache"))
    os.environ.setdefault("VLLM_RPC_BASE_PATH", os.path.join(tmp, "rpc"))
    os.makedirs(os.environ["VLLM_RPC_BASE_PATH"], exist_ok=True)  # TP's shared-memory queues bind sockets here
