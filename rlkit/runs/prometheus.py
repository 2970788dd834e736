"""An optional Prometheus `/metrics` endpoint of a run (`trainer.prometheus.port`), for dashboards people already run.

It serves what the driver already has: the status (step, total, phase, state) and the last logged value of every
metric, in Prometheus' text format (`rlkit_actor_pg_loss 0.12`). A standard-library HTTP server in a daemon
thread: a scrape never waits on the run, and the run never waits on a scrape.

It binds 127.0.0.1 unless `trainer.prometheus.host` says otherwise; bound wider it needs a token (from the
environment variable `trainer.prometheus.token_env` names, never from the config, which is saved with every
checkpoint), and answers 401 to a scrape without `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rlkit.errors import UserError

STATES = ("running", "finished", "failed", "interrupted")


def metric_name(key: str) -> str:
    """`actor/pg_loss` -> `rlkit_actor_pg_loss` (Prometheus names: letters, digits, underscores)."""
    return "rlkit_" + re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", key.replace("@", "_at_"))).strip("_")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def exposition(status: dict[str, Any], row: dict[str, float]) -> str:
    """The text a scrape gets: the run's gauges, then one gauge per logged metric (its last value)."""
    lines = []

    def gauge(name: str, value: float, labels: str = "", help_text: str = "") -> None:
        if help_text:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name}{labels} {value!r}")

    gauge("rlkit_step", float(status.get("step") or 0), help_text="the training step the run is at")
    if status.get("total"):
        gauge("rlkit_total_steps", float(status["total"]), help_text="the steps the run will take")
    gauge("rlkit_updated_at_seconds", float(status.get("updated_at") or 0), help_text="when the status last changed")
    lines += ["# HELP rlkit_state the run's state (1 for the current one)", "# TYPE rlkit_state gauge"]
    for state in STATES:
        lines.append(f'rlkit_state{{state="{state}"}} {1.0 if status.get("state") == state else 0.0}')
    phase = str(status.get("phase", "")).replace("\\", "").replace('"', "")
    gauge("rlkit_phase", 1.0, f'{{phase="{phase}"}}', "the phase of the step the driver is in")
    seen: set[str] = set()
    for key, value in sorted(row.items()):
        name = metric_name(key)
        if name in seen or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        seen.add(name)
        gauge(name, float(value), help_text=f"last logged {key}")
    return "\n".join(lines) + "\n"


class MetricsEndpoint:
    """`MetricsEndpoint(host, port, token).start()`; `set_status` / `set_row` feed it; `stop()` at the run's end."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        if not is_loopback(host) and not token:
            raise UserError(f"trainer.prometheus.host={host} exposes the run beyond this machine: set a token in the "
                            "environment variable trainer.prometheus.token_env names (scrapes then send "
                            "'Authorization: Bearer <token>'), or keep host=127.0.0.1")
        self.host, self.port, self.token = host, port, token
        self.status: dict[str, Any] = {}
        self.row: dict[str, float] = {}
        self._server: ThreadingHTTPServer | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> MetricsEndpoint:
        token = os.environ.get(cfg.token_env) if cfg.token_env else None
        return cls(cfg.host, int(cfg.port), token or None)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def set_status(self, status: dict[str, Any]) -> None:
        self.status = dict(status)

    def set_row(self, row: dict[str, Any], step: int) -> None:
        self.row = {**self.row, **{k: v for k, v in row.items() if isinstance(v, (int, float))}}

    def start(self) -> MetricsEndpoint:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if endpoint.token:
                    sent = self.headers.get("Authorization", "")
                    if not hmac.compare_digest(sent.encode(), f"Bearer {endpoint.token}".encode()):
                        self._reply(401, "a bearer token is required\n")
                        return
                if self.path.split("?")[0] != "/metrics":
                    self._reply(404, "only /metrics is served\n")
                    return
                self._reply(200, exposition(endpoint.status, endpoint.row))

            def _reply(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes are not the run's output
                pass

        try:
            self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        except OSError as exc:
            raise UserError(f"trainer.prometheus.port={self.port}: cannot listen on {self.host}:{self.port} ({exc}); "
                            "pick a free port, or 0 for any") from exc
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="rlkit-prometheus", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
