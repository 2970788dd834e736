"""`rlkit top [RUN]`: a live full-screen view of a run (Textual): the step and its phase, the ETA, each worker's
role/rank, phase, memory and liveness, the reward curve so far and the latest samples. It only reads what the run
publishes (rlkit/runs/live.py); `q` leaves the run as it was."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from rlkit.errors import UserError
from rlkit.runs.live import LiveRun, Snapshot
from rlkit.runs.plots import Panel, terminal
from rlkit.runs.read import find_runs, format_duration, latest_samples, resolve_run
from rlkit.runs.status import read_status
from rlkit_cli.commands.runs import DEFAULT_ROOT
from rlkit_cli.errors import friendly_errors

PANES = ("workers", "curve", "samples")


def register(app: typer.Typer) -> None:
    app.command("top")(top)


def newest_run(root: Path) -> Path:
    """The run under `root` whose status changed last (a running one first)."""
    runs = [(read_status(p) or {}, p) for p in find_runs(root)]
    if not runs:
        raise UserError(f"no runs under {root}; pass the run folder: rlkit top checkpoints/<project>/<experiment>")
    return max(runs, key=lambda sp: (sp[0].get("state") == "running", sp[0].get("updated_at") or 0))[1]


def header_text(name: str, snap: Snapshot) -> str:
    total = snap.total if snap.total is not None else "?"
    running = snap.state == "running" and snap.phase not in ("starting", "validate") and snap.step != snap.total
    step = f"step {snap.step + 1 if running else snap.step}/{total}"
    eta = f"eta {format_duration(snap.eta_s)}" if snap.eta_s is not None else "eta -"
    per = f"{snap.step_s:.1f}s/step" if snap.step_s else "-s/step"
    return (f"{name}  {snap.trainer}  [{snap.state}]  {step}  phase {snap.phase}  {per}  {eta}  "
            f"elapsed {format_duration(snap.elapsed_s)}")


def workers_table(snap: Snapshot) -> Table:
    table = Table(expand=True, title="workers" + ("" if snap.driver_alive is not False else " (driver gone)"))
    for col in ("worker", "roles", "pid", "phase", "cpu GB", "gpu GB", "alive"):
        table.add_column(col, overflow="fold")
    for w in snap.workers:
        alive = "?" if w.alive is None else ("yes" if w.alive else "DEAD")
        table.add_row(w.name, w.roles, str(w.pid), w.phase, "-" if w.rss_gb is None else f"{w.rss_gb:.2f}",
                      "-" if w.gpu_gb is None else f"{w.gpu_gb:.2f}", alive)
    if not snap.workers:
        table.add_row("-", "no workers published yet", "", "", "", "", "")
    return table


def curve_text(snap: Snapshot, width: int, height: int) -> str:
    panel = Panel("reward so far" if snap.trainer not in ("sft", "dpo") else "training loss so far")
    panel.title += " (train, validation)" if snap.val else ""
    if snap.reward:
        panel.series["train"] = ([x for x, _ in snap.reward], [y for _, y in snap.reward])
    if snap.val:
        panel.series["validation"] = ([x for x, _ in snap.val], [y for _, y in snap.val])
    if not panel.series:
        return "no steps logged yet"
    return terminal([panel], width=max(30, width), height=max(8, height), legend=len(panel.series) > 1)


def samples_table(folder: Path, limit: int = 4) -> Table:
    where, rows = latest_samples(folder, limit)
    table = Table(expand=True, show_lines=True, title=f"samples of step {rows[0].get('step', '?')}: {where}" if rows
                  else "no samples yet (trainer.rollout_data_dir or trainer.log_val_generations writes them)")
    table.add_column("prompt", ratio=3, overflow="fold")
    table.add_column("response", ratio=2, overflow="fold")
    table.add_column("score", justify="right")
    for r in rows:
        score = r.get("score")
        table.add_row(str(r.get("input", ""))[-200:], str(r.get("output", ""))[:200],
                      f"{score:.3f}" if isinstance(score, (int, float)) else str(score))
    return table


def build_app(folder: Path, refresh_s: float) -> Any:
    from textual.app import App, ComposeResult
    from textual.containers import VerticalScroll
    from textual.widgets import ContentSwitcher, Footer, Static

    live = LiveRun(folder)

    class TopApp(App):
        CSS = "#head { height: 2; background: $boost; } ContentSwitcher { height: 1fr; }"
        BINDINGS = [("q", "quit", "quit"), ("1", "pane('workers')", "workers"), ("2", "pane('curve')", "curve"),
                    ("3", "pane('samples')", "samples"), ("s", "pane('samples')", "step's samples"),
                    ("tab", "next_pane", "next pane")]
        refresh_ms: float = 0.0

        def compose(self) -> ComposeResult:
            yield Static(id="head")
            with ContentSwitcher(initial="workers"):
                yield VerticalScroll(Static(id="workers-body"), id="workers")
                yield Static(id="curve")
                yield VerticalScroll(Static(id="samples-body"), id="samples")
            yield Footer()

        def on_mount(self) -> None:
            self.refresh_view()
            self.set_interval(refresh_s, self.refresh_view)

        def refresh_view(self) -> None:
            began = time.perf_counter()
            snap = live.snapshot()
            switcher = self.query_one(ContentSwitcher)
            shown = switcher.current
            if shown == "workers":
                self.query_one("#workers-body", Static).update(workers_table(snap))
            elif shown == "curve":
                size = self.query_one("#curve", Static).size
                self.query_one("#curve", Static).update(Text(curve_text(snap, size.width, size.height)))
            else:
                self.query_one("#samples-body", Static).update(samples_table(folder))
            self.refresh_ms = (time.perf_counter() - began) * 1000
            line = header_text(folder.name, snap)
            extra = f"  refresh {self.refresh_ms:.0f}ms" + (f"\n{snap.error}" if snap.error else "")
            self.query_one("#head", Static).update(Text(line + extra))

        def on_resize(self) -> None:
            self.call_after_refresh(self.refresh_view)

        def action_pane(self, name: str) -> None:
            self.query_one(ContentSwitcher).current = name
            self.call_after_refresh(self.refresh_view)  # once laid out: the curve is drawn at the pane's size

        def action_next_pane(self) -> None:
            current = self.query_one(ContentSwitcher).current or PANES[0]
            self.action_pane(PANES[(PANES.index(current) + 1) % len(PANES)])

    return TopApp()


@friendly_errors
def top(
    run: str = typer.Argument(None, help="The run folder (trainer.default_local_dir) or its name under --root; "
                              "default: the newest running run under --root."),
    root: Path = typer.Option(Path(DEFAULT_ROOT), "--root", help="Where runs are looked for."),
    refresh: float = typer.Option(1.0, "--refresh", help="Seconds between refreshes."),
) -> None:
    """A live full-screen view of a run: its step and phase, ETA, each worker's roles, rank, phase, memory and
    liveness, the reward curve so far and the latest samples. Keys: 1 workers, 2 curve, 3 or s samples, tab next
    pane, q quit (the run goes on). Reads only what the run publishes; works over SSH in 80x24.

    Example: [bold]rlkit top checkpoints/rlkit/run[/bold]
    """
    if refresh <= 0:
        raise UserError(f"--refresh {refresh}: must be a positive number of seconds, e.g. --refresh 2")
    folder = resolve_run(run, root) if run else newest_run(root.expanduser())
    build_app(folder, refresh).run()
