"""`rlkit debug list|attach|stacks|replay`: find Ray workers paused at a breakpoint and debug them from a terminal;
read every process's stack of a run, paused or hung; run a recorded step's update again in this process."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import typer
from rich.console import Console
from rich.table import Table

from rlkit.controller.cluster import open_dashboard
from rlkit.debug.state import PausedWorker, paused_workers, peek_where, pick_worker
from rlkit.errors import UserError
from rlkit_cli.errors import friendly_errors

console = Console()
DASH_HELP = "Dashboard URL (default: the cluster `rlkit cluster up` started)."
TOKEN_HELP = ("The cluster's token file, for a head with token auth (default: the one of `rlkit cluster up`'s"
              " cluster; through an SSH tunnel, a copy of the head's).")  # fmt: skip


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Debug paused Ray workers from the terminal. Example: [bold]rlkit debug list[/bold]",
        no_args_is_help=True,
        rich_markup_mode="rich",
    )
    group.command("list")(list_workers)
    group.command("attach")(attach)
    group.command("replay")(replay)
    group.command("stacks")(stacks)
    app.add_typer(group, name="debug")


def find_paused(dashboard: str | None, where: bool = True, token_file: str | None = None) -> list[PausedWorker]:
    workers = paused_workers(open_dashboard(dashboard, token_file))
    if where:
        for w in workers:
            w.where = peek_where(w)
    return workers


def workers_table(workers: list[PausedWorker]) -> Table:
    table = Table(title=f"Paused workers ({len(workers)})", title_justify="left")
    for col in ("#", "role", "rank", "task", "stopped at", "node", "pid", "port", "worker"):
        table.add_column(col)
    for i, w in enumerate(workers):
        table.add_row(
            str(i),
            w.role,
            "-" if w.rank is None else str(w.rank),
            w.task or "-",
            w.where or "-",
            w.ip,
            str(w.pid),
            str(w.port),
            w.short_id(),
        )
    return table


@friendly_errors
def list_workers(
    dashboard: str = typer.Option(None, "--dashboard", help=DASH_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
    where: bool = typer.Option(True, "--where/--no-where", help="Show where local workers stopped (py-spy)."),
    token_file: str = typer.Option(
        None, "--token-file", envvar="RAY_AUTH_TOKEN_PATH", show_envvar=True, help=TOKEN_HELP
    ),
) -> None:
    """Workers paused in the debugger: role/actor, rank, task, where it stopped, node, pid, debug port.

    Example: [bold]rlkit debug list[/bold]   or, a remote head through `ssh -L 8265:127.0.0.1:8265 head`:
    [bold]rlkit debug list --dashboard 127.0.0.1:8265 --token-file ~/head_token[/bold]

    Exit status: 0 listed (none paused is not an error), 1 no dashboard or it refused the token (one line),
    2 bad usage.
    """
    workers = find_paused(dashboard, where=where, token_file=token_file)
    if as_json:
        typer.echo(json.dumps([asdict(w) for w in workers], indent=2))
        return
    if not workers:
        console.print("no paused workers (a worker shows up here when it hits breakpoint() in a --debug run)")
        return
    console.print(workers_table(workers))
    console.print(
        "attach here: [bold]rlkit debug attach"
        + ("" if len(workers) == 1 else " 0")
        + "[/bold]   or in VS Code: Ray Distributed Debugger -> click the paused worker"
    )


@friendly_errors
def attach(
    worker: str = typer.Argument(None, help="Index in `rlkit debug list`, pid, rankN or worker-id prefix."),
    local_folder: str = typer.Option(
        None, "--local-folder", help="Your checkout of the code the workers run (default: current directory)."
    ),
    remote_root: str = typer.Option(None, "--remote-root", help="The workers' code root if it differs (path mapping)."),
    host: str = typer.Option(None, "--host", help="Attach to this debugpy host directly (skips the dashboard)."),
    port: int = typer.Option(None, "--port", help="debugpy port (with --host)."),
    dashboard: str = typer.Option(None, "--dashboard", help=DASH_HELP),
    wait: float = typer.Option(0.0, "--wait", help="Seconds to wait for a worker to pause before giving up."),
    token_file: str = typer.Option(
        None, "--token-file", envvar="RAY_AUTH_TOKEN_PATH", show_envvar=True, help=TOKEN_HELP
    ),
) -> None:
    """Attach a terminal debugger (DAP) to a paused worker: stack, locals, p EXPR, n/s/finish, c, q to detach.

    Example: [bold]rlkit debug attach 0 --local-folder .[/bold]   or, a remote worker's debugpy forwarded with
    `ssh -L 5678:NODE_IP:PORT head` (NODE_IP, PORT from `rlkit debug list`):
    [bold]rlkit debug attach --host 127.0.0.1 --port 5678[/bold]

    Exit status: 0 detached, 1 no paused worker or the attach failed (one line), 2 bad usage.
    """
    from rlkit.debug.dap import DapError
    from rlkit.debug.repl import Repl
    from rlkit.debug.session import DebugSession

    if (host is None) != (port is None):
        raise UserError("--host and --port go together (or leave both out to pick a paused worker)")
    if host is None:
        target = _wait_for_worker(dashboard, worker, wait, token_file)
        host, port = target.ip, target.port
        console.print(f"attaching to {target.role} (pid {target.pid}) at {host}:{port} ...")
    folder = os.path.abspath(local_folder or os.getcwd())
    t0 = time.monotonic()
    try:
        session = DebugSession.attach(host, port, local_folder=folder, remote_root=remote_root)
    except DapError as exc:
        raise UserError(f"attach to {host}:{port} failed: {exc}") from None
    console.print(f"attached in {time.monotonic() - t0:.2f}s; `h` for help, `q` detaches (the worker continues)")
    Repl(session, console=console).run()


@friendly_errors
def stacks(
    run: str = typer.Option(None, "--run", help="The run's driver pid (default: the only run on this node)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of text."),
) -> None:
    """The current Python stack of a run's driver and of every one of its Ray workers on this node (hung or not),
    grouped by identical stacks, each with its role, rank and the phase it is in (read with py-spy: nothing pauses).

    Works for a run on its own Ray and for one on `rlkit cluster up`'s cluster.

    Example: [bold]rlkit debug stacks[/bold]   or   [bold]rlkit debug stacks --run 12345[/bold]
    """
    from rlkit.debug.stacks import collect, find_runs, pick_run, render

    run_id = pick_run(find_runs(), run)
    procs = collect(run_id)
    if as_json:
        typer.echo(json.dumps([{**asdict(p), "phase": p.phase} for p in procs], indent=2))
        return
    typer.echo(render(run_id, procs))


def _wait_for_worker(
    dashboard: str | None, selector: str | None, wait: float, token_file: str | None = None
) -> PausedWorker:
    deadline = time.monotonic() + wait
    while True:
        workers = find_paused(dashboard, where=False, token_file=token_file)
        if workers or time.monotonic() >= deadline:
            return pick_worker(workers, selector)
        time.sleep(0.5)


@friendly_errors
def replay(
    run: str = typer.Argument(..., help="The run's checkpoint root (trainer.default_local_dir), a global_step_N "
                              "folder before the step, or a step record file."),
    step: int = typer.Option(..., "--step", help="The step to replay (recorded with trainer.debug.record_steps, "
                             "or automatically when it failed)."),
    role: str = typer.Option("actor", "--role", help="actor | critic | ref | rollout: whose part of the step to run "
                             "(rollout: generate the step's responses again and count the rows that differ)."),
    break_at: str = typer.Option(None, "--break-at", help="Pause in pdb at a phase, e.g. actor.update_policy."),
) -> None:
    """Re-run step N's update from the checkpoint before it, in this process without Ray: breakpoint(), pdb,
    print and VS Code's "Python: current file" work in the worker code. Prints the replayed loss and gradient
    norm next to the run's logged ones.

    Example: [bold]rlkit debug replay checkpoints/rlkit/run --step 4 --break-at actor.update_policy[/bold]
    """
    from rlkit.trainer.replay.replay import replay_step

    result = replay_step(run, step, role, break_at, say=lambda line: console.print(line, markup=False, soft_wrap=True))
    table = Table(title=f"step {step} replayed ({role}; updates of steps {result.steps})", title_justify="left")
    for col in ("metric", "replayed", "run logged", "equal"):
        table.add_column(col)
    for key, value, logged in result.compared():
        same = "-" if logged is None else "yes" if logged == value else f"no ({value - logged:+.3g})"
        table.add_row(key, repr(value), "-" if logged is None else repr(logged), same)
    console.print(table)
    rows = [(value, logged) for _, value, logged in result.compared() if logged is not None]
    if not rows:
        console.print("compared with the recorded batch (the run's metrics.jsonl has none of these)")
    else:
        differ = sum(value != logged for value, logged in rows)
        console.print(f"{len(rows) - differ} of {len(rows)} metrics equal the run's logged ones bit for bit"
                      + ("" if not differ else f"; {differ} differ (docs/debugging.md#12-replay-a-step-in-one-process "
                                               "says when a replay can)"))
