"""Is the network usable? Probes that fail fast on an air-gapped machine (DNS included, which
`urllib` does not bound) and the `RLKIT_OFFLINE=1` switch; used by the model hub and the trackers."""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

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
