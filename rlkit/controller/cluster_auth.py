"""Token auth for a process that connects to an rlkit cluster: set it up, and check the token first.

Ray's own failure with a missing or wrong token is slow and long: `ray.init` retries for 20 s and
raises "Failed to connect", `ray start --address` prints a traceback after 22 s. Asking the GCS
once (a GcsClient answers AuthenticationError at once) gives one line that names the file and the fix.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlkit.controller.cluster import Target
from rlkit.errors import UserError
from rlkit.utils import ray_token


def use_token(token_file: str | Path) -> None:
    """This process (and what it starts) uses the token in `token_file`; Ray's cached mode is refreshed."""
    os.environ.pop(ray_token.VALUE_ENV, None)  # Ray prefers the value to any file
    os.environ.update(ray_token.token_env(token_file))
    refresh_ray_auth()


def refresh_ray_auth() -> None:
    """Ray reads RAY_AUTH_MODE once (RayConfig) and caches the token: re-read both when Ray is already loaded."""
    if "ray._raylet" not in sys.modules:
        return  # read fresh at import
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def check_head(address: str, source: str, timeout: float = 5.0) -> None:
    """Fail in one line unless the head at `address` is reachable and accepts this process's token (from `source`).

    Call after use_token (or with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN set).
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"{address!r} is not a Ray address; pass HOST:PORT, e.g. 10.0.0.1:6379")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise UserError(
            f"cannot reach the Ray head at {address} ({exc.strerror or exc}); is `rlkit cluster up --listen-all`"
            " running there, and is the port open to this machine?"
        ) from None
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        with _no_native_stderr():  # Ray's C++ client logs each refusal itself; our line says it once
            GcsClient(address=address)
    except AuthenticationError:
        raise UserError(f"the Ray head at {address} rejected the token from {source}; {ray_token.FIX}") from None


@contextmanager
def _no_native_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a moment (C++ writes there directly, past sys.stderr)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def join_auth(target: Target) -> str | None:
    """Before `ray.init` joins `target`: the cluster of `rlkit cluster up` on the network needs its token (checked
    here, in one line); a loopback one runs with auth off. Returns the token file used, if any."""
    info = target.joined
    if info is None:
        return None
    if not info.token_file:
        os.environ.setdefault(ray_token.MODE_ENV, "disabled")  # how `rlkit cluster up` started it
        return None
    ray_token.read_token(info.token_file)  # missing or open to others: one line
    use_token(info.token_file)
    check_head(info.address, info.token_file)
    return info.token_file
