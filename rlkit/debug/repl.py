"""The terminal front-end of `rlkit debug attach`: a pdb-like loop over a DAP session.

For SSH sessions without VS Code. Commands (pdb spellings where they exist):
  bt/where  l/list [LINE]  p EXPR (or any expression)  pp EXPR  locals  exc
  n/next  s/step  finish/out/r  c/continue  up/u [N]  down/d [N]  frame N  q/quit/detach  h/help
An empty line repeats the last step command. `q` detaches: the worker resumes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape

from rlkit.debug.dap import DapError, DapTimeout
from rlkit.debug.session import DebugSession, Frame

HELP = """commands:
  bt | where          stack of the stopped thread (> marks the current frame)
  l | list [LINE]     source around the current line (or LINE)
  p EXPR | EXPR       evaluate in the current frame     pp EXPR: full value
  locals              local variables of the current frame
  exc                 the exception (post-mortem stops)
  n | next            step over        s | step: step in        finish | out | r: step out
  c | continue        run to the next breakpoint (Ctrl-C while waiting: detach)
  up | u [N], down | d [N], frame N   move in the stack
  q | quit | detach   release the worker (it resumes) and exit
"""
_STEPS = {"n": "next", "next": "next", "s": "stepIn", "step": "stepIn", "finish": "stepOut", "out": "stepOut",
          "r": "stepOut", "return": "stepOut"}  # fmt: skip
_MAX_VALUE = 160


@dataclass
class Repl:
    session: DebugSession
    console: Console = field(default_factory=Console)
    read: Callable[[str], str] = input
    context: int = 5  # source lines shown each side of the current line
    frames: list[Frame] = field(default_factory=list)
    index: int = 0
    last: str = ""

    # -- display ---------------------------------------------------------------------------
    def refresh(self) -> None:
        self.frames = self.session.stack()
        self.index = 0

    @property
    def frame(self) -> Frame | None:
        return self.frames[self.index] if self.frames else None

    def show_stop(self) -> None:
        stop = self.session.stop
        if stop is None:
            return
        self.refresh()
        what = f"stopped ({stop.reason})"
        if stop.is_exception:
            what += f": {stop.description or stop.text}"
        self.console.print(f"[bold yellow]{escape(what)}[/bold yellow]")
        if stop.is_exception:
            self.show_exception()
        self.show_frame()
        self.show_locals(limit=12)

    def show_frame(self, around: int | None = None) -> None:
        frame = self.frame
        if frame is None:
            self.console.print("no stack (the worker is running)")
            return
        self.console.print(f"[bold]#{self.index} {escape(frame.where())}[/bold]")
        lines = self.session.source_lines(frame)
        if not lines:
            self.console.print("  (source not available here; pass --local-folder)")
            return
        center = around or frame.line
        lo, hi = max(1, center - self.context), min(len(lines), center + self.context)
        for n in range(lo, hi + 1):
            mark = "->" if n == frame.line else "  "
            self.console.print(f"{mark}{n:5d}  {lines[n - 1]}", markup=False, highlight=False)

    def show_stack(self) -> None:
        for i, frame in enumerate(self.frames):
            mark = ">" if i == self.index else " "
            self.console.print(f"{mark} #{i:<3d}{frame.where()}", markup=False, highlight=False)

    def show_locals(self, limit: int | None = None) -> None:
        if self.frame is None:
            return
        variables = self.session.locals(self.frame.id)
        shown = variables if limit is None else variables[:limit]
        self.console.print("[dim]locals:[/dim]" if shown else "[dim]locals: (none)[/dim]")
        for var in shown:
            kind = f" ({var.type})" if var.type else ""
            self.console.print(f"  {var.name}{kind} = {_short(var.value)}", markup=False, highlight=False)
        if limit is not None and len(variables) > limit:
            self.console.print(f"  ... {len(variables) - limit} more (`locals`)", markup=False)

    def show_exception(self) -> None:
        info = self.session.exception_info()
        if not info:
            self.console.print("not stopped on an exception")
            return
        details = info.get("details") or {}
        trace = details.get("stackTrace")
        if trace:  # debugpy's text already ends with "Type: message"
            self.console.print(str(trace).rstrip(), markup=False, highlight=False)
        else:
            type_name = str(details.get("typeName") or info.get("exceptionId", "")).split("  ")[0].strip()
            self.console.print(f"{type_name}: {details.get('message') or info.get('description', '')}", markup=False)

    # -- loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """Show the stop, then read commands until `q`, EOF or the worker goes away; always detach."""
        try:
            try:
                self.show_stop()
            except DapError as exc:
                self.console.print(f"[red]{escape(str(exc))}[/red]")
            while not self.session.client.closed:
                try:
                    line = self.read("(rlkit-debug) ").strip()
                except EOFError:
                    break
                if not line and self.last in _STEPS:
                    line = self.last
                if not line:
                    continue
                if not self.handle(line):
                    break
        except KeyboardInterrupt:
            self.console.print()
        finally:
            self.session.detach()
            self.console.print("detached; the worker continues")

    def handle(self, line: str) -> bool:
        """Run one command; False means leave the loop."""
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        self.last = cmd
        try:
            return self._dispatch(cmd, arg, line)
        except DapTimeout as exc:
            self.console.print(f"[red]timeout:[/red] {escape(str(exc))}")
        except DapError as exc:
            self.console.print(f"[red]{escape(str(exc).splitlines()[-1] if str(exc) else 'error')}[/red]")
        return not self.session.client.closed

    def _dispatch(self, cmd: str, arg: str, line: str) -> bool:
        if cmd in ("q", "quit", "exit", "detach"):
            return False
        if cmd in ("h", "help", "?"):
            self.console.print(HELP, markup=False)
        elif cmd in ("bt", "where", "w"):
            self.show_stack()
        elif cmd in ("l", "list"):
            self.show_frame(around=int(arg) if arg.isdigit() else None)
        elif cmd == "locals":
            self.show_locals()
        elif cmd == "exc":
            self.show_exception()
        elif cmd in ("p", "pp") and arg:
            self.print_eval(arg, full=cmd == "pp")
        elif cmd in _STEPS:
            self.session.step(_STEPS[cmd])
            self.show_stop()
        elif cmd in ("c", "cont", "continue"):
            return self.cont()
        elif cmd in ("up", "u", "down", "d", "frame", "f"):
            self.move(cmd, arg)
        else:
            self.print_eval(line)
        return True

    def print_eval(self, expr: str, full: bool = False) -> None:
        frame_id = self.frame.id if self.frame else None
        var = self.session.evaluate(expr, frame_id, context="clipboard" if full else "repl")
        self.console.print(var.value if full else _short(var.value, 2000), markup=False, highlight=False)

    def move(self, cmd: str, arg: str) -> None:
        if not self.frames:
            return
        n = int(arg) if arg.lstrip("-").isdigit() else 1
        target = {"up": self.index + n, "u": self.index + n, "down": self.index - n, "d": self.index - n}.get(cmd, n)
        self.index = max(0, min(len(self.frames) - 1, target))
        self.show_frame()

    def cont(self) -> bool:
        self.session.resume()
        self.frames = []
        self.console.print("running until the next breakpoint (Ctrl-C to detach) ...")
        while True:
            try:
                self.session.wait_stopped(timeout=0.5)
            except DapTimeout:
                continue
            except DapError:
                self.console.print("the worker closed the debug connection")
                return False
            self.show_stop()
            return True


def _short(value: str, limit: int = _MAX_VALUE) -> str:
    value = value.replace("\n", "\\n")
    return value if len(value) <= limit else value[: limit - 3] + "..."
