"""Is the network usable? Probes that fail fast on an air-gapped machine (DNS included, which
`urllib` does not bound) and the `RLKIT_OFFLINE=1` switch; used by the model hub and the trackers. And the one
retry policy of rlkit's HTTP clients (the judge, the served teacher): `post_with_retries`."""

from __future__ import annotations

import asyncio
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

PROBE_TIMEOUT_S = 2.0
_TRUE = {"1", "true", "yes", "on"}


def env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def network_disabled() -> bool:
    """`RLKIT_OFFLINE=1` forbids every download (hub and PyPI)."""
    return env_true("RLKIT_OFFLINE")


def url_reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when an HTTP(S) HEAD to `url` answers at all (any status) within `timeout` seconds.

    Runs in a daemon thread so a hanging DNS lookup cannot stall the caller past the timeout.
    """
    result: list[bool] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
            result.append(True)
        except urllib.error.HTTPError:
            result.append(True)  # the server answered; an error status still means reachable
        except Exception:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(result and result[0])


# ------------------------------------------------------------- HTTP requests
RETRY_STATUS = (408, 429)


@dataclass
class Posted:
    """What `post_with_retries` got: the reply to read (a success, or a 4xx not worth retrying), or None when every
    attempt failed, with why the last one did."""

    reply: Any | None
    error: str
    attempts: int


async def post_with_retries(client: Any, gate: asyncio.Semaphore, httpx: Any, url: str, payload: dict, *,
                            timeout_s: float, retries: int, backoff_s: float) -> Posted:
    """POST `payload` under the concurrency `gate`, retrying timeouts, connection errors, 5xx, 408 and 429 with an
    exponential backoff (the judge's and the served teacher's one retry policy)."""
    error = "no attempt"
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
        async with gate:
            try:
                reply = await asyncio.wait_for(client.post(url, json=payload), timeout_s)
            except (asyncio.TimeoutError, httpx.TimeoutException):
                error = "timeout"
                continue
            except httpx.HTTPError as exc:
                error = f"connection: {type(exc).__name__}: {exc}"
                continue
        if reply.status_code >= 500 or reply.status_code in RETRY_STATUS:
            error = f"http {reply.status_code}"
            continue
        return Posted(reply, "", attempt + 1)
    return Posted(None, error, retries + 1)
