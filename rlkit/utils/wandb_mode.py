"""Whether a wandb run logs online or offline, and the one line an offline run prints.

verl's scripts put `wandb` in `trainer.logger`; a run without an API key or without a network must still
train (and keep its metrics), as `WANDB_MODE=offline` does: the run is written under `<log_dir>/wandb/` and
uploaded later with `wandb sync`. An explicit `WANDB_MODE` is kept as set.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_URL = "https://api.wandb.ai"


def base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", DEFAULT_URL)


def has_api_key() -> bool:
    """An API key in `WANDB_API_KEY`, or one `wandb login` stored in ~/.netrc (or `$NETRC`) for the server."""
    if os.environ.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(base_url()).hostname or ""
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        auth = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def choose_mode() -> tuple[str, str]:
    """(mode, why): `WANDB_MODE` when set; else online with a key and a reachable server, offline otherwise."""
    from rlkit.utils.network import network_disabled, url_reachable

    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode:
        return mode, f"WANDB_MODE={mode}"
    if not has_api_key():
        return "offline", "no API key (WANDB_API_KEY or `wandb login`)"
    if network_disabled():
        return "offline", "RLKIT_OFFLINE=1"
    if not url_reachable(base_url()):
        return "offline", f"{base_url()} is not reachable"
    return "online", ""


def offline_line(why: str, run_dir: str | Path) -> str:
    """The one line of an offline run: where it is written and how to upload it."""
    return f"wandb: {why}: logging offline to {run_dir}; upload it later with `wandb sync {run_dir}`"
