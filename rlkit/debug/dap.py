"""A small Debug Adapter Protocol client (Content-Length framed JSON over TCP).

debugpy's adapter speaks DAP; talking to it directly is what lets `rlkit debug
attach` work over SSH with no VS Code, and lets CI drive a real debug session.
This module only knows the wire protocol: requests matched to responses by
`seq`, events kept in arrival order. The attach handshake lives in session.py.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]


class DapError(RuntimeError):
    """The adapter answered a request with `success: false`, or went away."""


class DapTimeout(DapError, TimeoutError):
    """No answer (or no awaited event) within the timeout."""


class Pending:
    """A request sent but not answered yet; `result()` waits for the response body."""

    def __init__(self, command: str, seq: int) -> None:
        self.command = command
        self.seq = seq
        self._done = threading.Event()
        self._response: Message | None = None

    def _set(self, response: Message) -> None:
        self._response = response
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        if not self._done.wait(timeout):
            raise DapTimeout(f"no response to '{self.command}' within {timeout}s")
        resp = self._response or {}
        if not resp.get("success", False):
            raise DapError(f"'{self.command}' failed: {resp.get('message') or resp.get('body') or 'no reason given'}")
        return resp.get("body") or {}


class DapClient:
    """Thread-safe DAP client over one socket; a reader thread files responses and events."""

    def __init__(self, sock: socket.socket, timeout: float = 15.0) -> None:
        self.timeout = timeout
        self._sock = sock
        self._wlock = threading.Lock()
        self._seq = itertools.count(1)
        self._pending: dict[int, Pending] = {}
        self._events: deque[Message] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._close_reason = ""
        self._reader = threading.Thread(target=self._read_loop, name="dap-reader", daemon=True)
        self._reader.start()

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 15.0) -> DapClient:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise DapError(f"cannot connect to the debug adapter at {host}:{port}: {exc}") from None
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, timeout=timeout)

    # -- sending ---------------------------------------------------------------------------
    def send(self, command: str, arguments: dict[str, Any] | None = None) -> Pending:
        """Send a request without waiting (needed for `attach`, answered only after configurationDone)."""
        seq = next(self._seq)
        msg: Message = {"seq": seq, "type": "request", "command": command}
        if arguments is not None:
            msg["arguments"] = arguments
        pending = Pending(command, seq)
        with self._cond:
            if self._closed:
                raise DapError(f"connection closed ({self._close_reason}); cannot send '{command}'")
            self._pending[seq] = pending
        data = json.dumps(msg).encode("utf-8")
        with self._wlock:
            try:
                self._sock.sendall(b"Content-Length: %d\r\n\r\n" % len(data) + data)
            except OSError as exc:
                raise DapError(f"cannot send '{command}': {exc}") from None
        return pending

    def request(self, command: str, arguments: dict[str, Any] | None = None, timeout: float | None = None) -> dict:
        """Send a request and wait for its response body (raises DapError on failure)."""
        return self.send(command, arguments).result(self.timeout if timeout is None else timeout)

    # -- events ----------------------------------------------------------------------------
    def wait_event(
        self, name: str, timeout: float | None = None, where: Callable[[Message], bool] | None = None
    ) -> Message:
        """Take the oldest unconsumed event called `name` (matching `where`); other events stay queued."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            while True:
                for ev in self._events:
                    if ev.get("event") == name and (where is None or where(ev)):
                        self._events.remove(ev)
                        return ev
                if self._closed:
                    raise DapError(f"connection closed ({self._close_reason}) while waiting for '{name}'")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DapTimeout(f"no '{name}' event within {timeout if timeout is not None else self.timeout}s")
                self._cond.wait(left)

    def drain_events(self, name: str | None = None) -> list[Message]:
        """Remove and return the queued events (all, or only those called `name`)."""
        with self._cond:
            taken = [ev for ev in self._events if name is None or ev.get("event") == name]
            for ev in taken:
                self._events.remove(ev)
            return taken

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=2)

    # -- reading ---------------------------------------------------------------------------
    def _read_loop(self) -> None:
        buf = b""
        reason = "adapter closed the connection"
        try:
            while True:
                msg, buf = _read_message(self._sock, buf)
                if msg is None:
                    break
                self._dispatch(msg)
        except (OSError, ValueError) as exc:
            reason = str(exc) or type(exc).__name__
        with self._cond:
            self._closed = True
            self._close_reason = reason
            pending = list(self._pending.values())
            self._pending.clear()
            self._cond.notify_all()
        for p in pending:
            p._set({"success": False, "message": f"connection closed ({reason})"})

    def _dispatch(self, msg: Message) -> None:
        kind = msg.get("type")
        if kind == "response":
            with self._cond:
                pending = self._pending.pop(msg.get("request_seq", -1), None)
            if pending is not None:
                pending._set(msg)
        elif kind == "event":
            with self._cond:
                self._events.append(msg)
                self._cond.notify_all()
        elif kind == "request":
            # Reverse requests (runInTerminal, startDebugging): we support none; say so politely.
            self._reply_unsupported(msg)

    def _reply_unsupported(self, req: Message) -> None:
        resp = {
            "seq": next(self._seq),
            "type": "response",
            "request_seq": req.get("seq"),
            "command": req.get("command"),
            "success": False,
            "message": "not supported by rlkit debug",
        }
        data = json.dumps(resp).encode("utf-8")
        with self._wlock:
            try:
                self._sock.sendall(b"Content-Length: %d\r\n\r\n" % len(data) + data)
            except OSError:
                pass


def _read_message(sock: socket.socket, buf: bytes) -> tuple[Message | None, bytes]:
    """Read one framed message: headers, blank line, then Content-Length bytes of JSON."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None, buf
        buf += chunk
    header, _, rest = buf.partition(b"\r\n\r\n")
    length = None
    for line in header.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length is None:
        raise ValueError(f"DAP header without Content-Length: {header!r}")
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None, rest
        rest += chunk
    return json.loads(rest[:length].decode("utf-8")), rest[length:]
