"""One debug session with a paused Ray worker, on top of the raw DAP client.

It performs the attach handshake the way VS Code does with debugpy, and offers
the few operations a terminal front-end or a test needs: stack, locals,
evaluate, step, continue, exception info, and a safe detach.

Handshake (the order matters: debugpy answers `attach` only after
`configurationDone`, and the Ray worker only leaves `wait_for_client()` then):
  initialize -> attach (not awaited) -> event `initialized` -> setExceptionBreakpoints
  -> configurationDone -> attach response -> event `stopped`.
Releasing a worker is `disconnect` (terminateDebuggee false); it resumes the program.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.debug.dap import DapClient, DapError

# Grouping nodes debugpy adds to scopes; noise in a terminal listing.
_GROUPS = {"special variables", "function variables", "class variables", "protected variables"}


@dataclass
class Frame:
    id: int
    name: str
    path: str
    line: int
    source_ref: int = 0

    def where(self) -> str:
        return f"{self.name} at {self.path}:{self.line}"


@dataclass
class Variable:
    name: str
    value: str
    type: str = ""
    ref: int = 0  # > 0: has children (use `variables(ref)`)


@dataclass
class Stop:
    reason: str
    thread_id: int
    description: str = ""
    text: str = ""

    @property
    def is_exception(self) -> bool:
        return self.reason == "exception"


@dataclass
class DebugSession:
    client: DapClient
    local_folder: str | None = None
    remote_root: str | None = None
    stop: Stop | None = None
    timeout: float = 15.0
    _sources: dict[str, list[str]] = field(default_factory=dict)

    # -- lifecycle ----------------------------------------------------------------------------
    @classmethod
    def attach(
        cls,
        host: str,
        port: int,
        *,
        local_folder: str | None = None,
        remote_root: str | None = None,
        exception_filters: tuple[str, ...] = ("uncaught",),
        timeout: float = 15.0,
    ) -> DebugSession:
        """Attach like the VS Code extension does and wait for the worker to report where it stopped."""
        client = DapClient.connect(host, port, timeout=timeout)
        session = cls(client, local_folder=local_folder, remote_root=remote_root, timeout=timeout)
        try:
            session._handshake(exception_filters)
        except BaseException:
            client.close()
            raise
        return session

    def _handshake(self, exception_filters: tuple[str, ...]) -> None:
        c = self.client
        c.request(
            "initialize",
            {
                "clientID": "rlkit",
                "clientName": "rlkit debug",
                "adapterID": "debugpy",
                "pathFormat": "path",
                "linesStartAt1": True,
                "columnsStartAt1": True,
                "supportsVariableType": True,
                "supportsRunInTerminalRequest": False,
                "locale": "en-us",
            },
        )
        mappings = []
        if self.local_folder and self.remote_root:
            mappings = [{"localRoot": self.local_folder, "remoteRoot": self.remote_root}]
        attach = c.send("attach", {"justMyCode": False, "pathMappings": mappings, "redirectOutput": False})
        c.wait_event("initialized", self.timeout)
        c.request("setExceptionBreakpoints", {"filters": list(exception_filters)})
        c.request("configurationDone")
        attach.result(self.timeout)
        self.stop = self.wait_stopped(self.timeout)

    def detach(self) -> None:
        """Release the worker: `disconnect` without terminating; the program continues."""
        if not self.client.closed:
            try:
                self.client.request("disconnect", {"restart": False, "terminateDebuggee": False}, timeout=5)
            except DapError:
                pass  # the adapter may hang up before answering; the worker is released either way
        self.client.close()

    # -- execution control ----------------------------------------------------------------------
    def wait_stopped(self, timeout: float | None) -> Stop:
        ev = self.client.wait_event("stopped", timeout)
        body = ev.get("body", {})
        self.stop = Stop(
            reason=body.get("reason", ""),
            thread_id=int(body.get("threadId", 0)),
            description=body.get("description", "") or "",
            text=body.get("text", "") or "",
        )
        return self.stop

    def _thread(self) -> int:
        if self.stop is None:
            raise DapError("the worker is running; nothing to inspect")
        return self.stop.thread_id

    def step(self, kind: str = "next", timeout: float | None = None) -> Stop:
        """kind: next (over), stepIn, stepOut. Waits for the next stop."""
        thread = self._thread()
        self.client.drain_events("stopped")
        self.client.request(kind, {"threadId": thread})
        self.stop = None
        return self.wait_stopped(self.timeout if timeout is None else timeout)

    def resume(self) -> None:
        """`continue`: the worker runs until its next breakpoint (then `wait_stopped`) or forever."""
        thread = self._thread()
        self.client.drain_events("stopped")
        self.client.request("continue", {"threadId": thread})
        self.stop = None

    # -- inspection ---------------------------------------------------------------------------
    def stack(self, levels: int = 64) -> list[Frame]:
        body = self.client.request("stackTrace", {"threadId": self._thread(), "startFrame": 0, "levels": levels})
        frames = []
        for f in body.get("stackFrames", []):
            src = f.get("source") or {}
            frames.append(
                Frame(
                    id=int(f["id"]),
                    name=str(f.get("name", "?")),
                    path=str(src.get("path") or src.get("name") or "?"),
                    line=int(f.get("line", 0)),
                    source_ref=int(src.get("sourceReference") or 0),
                )
            )
        return frames

    def variables(self, ref: int) -> list[Variable]:
        body = self.client.request("variables", {"variablesReference": ref})
        return [
            Variable(
                name=str(v.get("name")),
                value=str(v.get("value", "")),
                type=str(v.get("type", "") or ""),
                ref=int(v.get("variablesReference") or 0),
            )
            for v in body.get("variables", [])
            if v.get("name") not in _GROUPS
        ]

    def locals(self, frame_id: int) -> list[Variable]:
        scopes = self.client.request("scopes", {"frameId": frame_id}).get("scopes", [])
        for scope in scopes:
            if scope.get("name", "").lower().startswith("local"):
                return self.variables(int(scope["variablesReference"]))
        return self.variables(int(scopes[0]["variablesReference"])) if scopes else []

    def evaluate(self, expression: str, frame_id: int | None = None, context: str = "repl") -> Variable:
        args: dict = {"expression": expression, "context": context}
        if frame_id is not None:
            args["frameId"] = frame_id
        body = self.client.request("evaluate", args)
        return Variable(
            name=expression,
            value=str(body.get("result", "")),
            type=str(body.get("type", "") or ""),
            ref=int(body.get("variablesReference") or 0),
        )

    def exception_info(self) -> dict | None:
        """debugpy's exceptionInfo for the stopped thread (None when it did not stop on an exception)."""
        if self.stop is None or not self.stop.is_exception:
            return None
        return self.client.request("exceptionInfo", {"threadId": self.stop.thread_id})

    # -- sources --------------------------------------------------------------------------------
    def local_path(self, remote: str) -> str | None:
        """Where the worker's file lives here: same path, mapped root, or a suffix under --local-folder."""
        if os.path.isfile(remote):
            return remote
        if self.local_folder:
            root = Path(self.local_folder)
            if self.remote_root and remote.startswith(self.remote_root.rstrip("/") + "/"):
                cand = root / remote[len(self.remote_root.rstrip("/")) + 1 :]
                if cand.is_file():
                    return str(cand)
            parts = Path(remote).parts
            for i in range(1, len(parts)):  # e.g. .../_ray_pkg_abc/rlkit/x.py -> <local>/rlkit/x.py
                cand = root.joinpath(*parts[i:])
                if cand.is_file():
                    return str(cand)
        return None

    def source_lines(self, frame: Frame) -> list[str]:
        """The frame's file, read locally when possible, else fetched from the worker itself."""
        if frame.path in self._sources:
            return self._sources[frame.path]
        lines: list[str] = []
        local = self.local_path(frame.path)
        if local:
            lines = Path(local).read_text(errors="replace").splitlines()
        elif frame.source_ref:
            body = self.client.request("source", {"sourceReference": frame.source_ref})
            lines = str(body.get("content", "")).splitlines()
        elif frame.path.endswith(".py"):
            lines = self._remote_read(frame)
        self._sources[frame.path] = lines
        return lines

    def _remote_read(self, frame: Frame) -> list[str]:
        expr = f"open({frame.path!r}, encoding='utf-8', errors='replace').read()"
        try:
            text = self.evaluate(expr, frame.id, context="clipboard").value
            return str(ast.literal_eval(text)).splitlines()
        except (DapError, ValueError, SyntaxError):
            return []
