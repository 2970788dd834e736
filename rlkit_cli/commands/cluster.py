"""`rlkit cluster up|status|down`: a long-lived local Ray head to train on and debug against."""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.table import Table

from rlkit.controller import cluster as cl
from rlkit.debug.listeners import LOOPBACK_ENV
from rlkit.debug.state import Dashboard, paused_workers, peek_where
from rlkit_cli.errors import friendly_errors

console = Console()


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Start, inspect and stop a local Ray head. Example: [bold]rlkit cluster up --num-cpus 4[/bold]",
        no_args_is_help=True,
        rich_markup_mode="rich",
    )
    group.command("up")(up)
    group.command("status")(status)
    group.command("down")(down)
    app.add_typer(group, name="cluster")


@friendly_errors
def up(
    num_cpus: float = typer.Option(None, "--num-cpus", help="CPUs to offer (default: all)."),
    num_gpus: float = typer.Option(None, "--num-gpus", help="GPUs to offer (default: all visible)."),
    port: int = typer.Option(cl.DEFAULT_PORT, "--port", help="GCS port: the address drivers connect to."),
    dashboard_port: int = typer.Option(cl.DEFAULT_DASHBOARD_PORT, "--dashboard-port", help="Dashboard HTTP port."),
    dashboard_host: str = typer.Option(
        "127.0.0.1", "--dashboard-host", help="Bind address of the dashboard; 0.0.0.0 opens it to the network."
    ),
    temp_dir: str = typer.Option(None, "--temp-dir", help="Ray temp dir (default: /tmp/rlkit-ray-PORT)."),
    node_ip: str = typer.Option(
        None, "--node-ip", help="Multi-node: Ray listens on this address so other nodes can join (auth is off)."
    ),
    listen_all: bool = typer.Option(
        False, "--listen-all", help="Multi-node: like --node-ip with the address Ray picks (auth is off)."
    ),
) -> None:
    """Start a Ray head with the dashboard (token auth off, so the VS Code debugger can talk to it).

    Single node by default: every Ray service listens on 127.0.0.1 only. `rlkit train` and
    `rlkit eval` join this cluster while it is up (`--address local` keeps a run private).

    Example: [bold]rlkit cluster up --num-cpus 8 --num-gpus 2[/bold]
    """
    t0 = time.monotonic()
    with console.status("starting the Ray head ..."):
        info = cl.start_cluster(
            num_cpus, num_gpus, port, dashboard_port, dashboard_host, temp_dir, node_ip=node_ip, listen_all=listen_all
        )
    console.print(f"[green]Ray head up[/green] in {time.monotonic() - t0:.0f}s")
    _print_info(info)
    _print_exposure(info)
    if dashboard_host not in ("127.0.0.1", "localhost"):
        console.print(
            f"[yellow]warning:[/yellow] the dashboard listens on {dashboard_host}: anyone who can reach it can run"
            " code on this cluster (token auth is off). Keep it on a trusted network."
        )
    join = "" if info.loopback else f"\n  other nodes:     RAY_AUTH_MODE=disabled ray start --address {info.address}"
    console.print(
        "\n[bold]Next:[/bold]\n"
        "  train on it:     rlkit train grpo ...   (joins this cluster; add --debug to debug workers)\n"
        f"  VS Code:         Ray Distributed Debugger view -> Add Cluster -> {_host_port(info.dashboard_url)}\n"
        "  terminal:        rlkit debug list   /   rlkit debug attach\n"
        f"  own Ray scripts: {_script_env(info)} python my.py   (my.py: ray.init(address=\"{info.address}\")){join}\n"
        "  stop it:         rlkit cluster down",
        soft_wrap=True,
    )


def _script_env(info: cl.ClusterInfo) -> str:
    """What a plain Ray driver needs in its environment to connect (rlkit commands set it themselves)."""
    env = {**cl.AUTH_ENV, **(LOOPBACK_ENV if info.loopback else {})}
    return " ".join(f"{k}={v}" for k, v in env.items())


def _print_exposure(info: cl.ClusterInfo) -> None:
    """Say where Ray listens: loopback only, or (one warning line) that it is on the network without auth."""
    found = cl.cluster_listeners(info)
    open_ = [str(item) for item in found if not item.loopback]
    if not info.loopback:
        console.print(
            f"[yellow]warning:[/yellow] multi-node mode: Ray listens on the network (node IP {info.node_ip}) and token"
            " auth is off: anyone who can reach its ports can run code here; keep the nodes on a trusted network.",
            soft_wrap=True,
        )
    elif open_:
        console.print(
            "[yellow]warning:[/yellow] these Ray services listen beyond loopback on a single-node cluster (token auth"
            " is off); block them with a firewall: " + ", ".join(open_),
            soft_wrap=True,
        )
    if not open_:
        console.print(f"listening on loopback only: {len(found)} sockets on 127.0.0.1 (GCS, raylet, agents, ...)")
    elif not info.loopback:
        console.print("listening beyond loopback:\n  " + "\n  ".join(open_), soft_wrap=True)


@friendly_errors
def status(
    dashboard: str = typer.Option(None, "--dashboard", help="Dashboard URL (default: the cluster `up` started)."),
) -> None:
    """Nodes, resources, running jobs and paused debug workers of the cluster.

    Example: [bold]rlkit cluster status[/bold]
    """
    url = cl.resolve_dashboard(dashboard)
    info = cl.running_cluster()
    if info is not None and info.dashboard_url == url:
        _print_info(info)
    else:
        console.print(f"dashboard: {url}")
    dash = Dashboard(url)
    console.print(_nodes_table(dash.list("nodes")))
    console.print(_resources_table(dash.resource_usage()))
    console.print(_jobs_table(dash.list("jobs")))
    workers = paused_workers(dash)
    for w in workers:
        w.where = peek_where(w)
    if workers:
        from rlkit_cli.commands.debug import workers_table

        console.print(workers_table(workers))
        console.print("attach: [bold]rlkit debug attach[/bold] (or click it in VS Code's Ray Distributed Debugger)")
    else:
        console.print("paused debug workers: none")


@friendly_errors
def down() -> None:
    """Stop the cluster `rlkit cluster up` started (only its processes; other Ray clusters are left alone).

    Nothing to stop is not an error (exit 0).

    Example: [bold]rlkit cluster down[/bold]
    """
    with console.status("stopping the Ray head ..."):
        stopped = cl.stop_cluster()
    if stopped is None:
        console.print("no cluster started by `rlkit cluster up` is running; nothing to stop")
        return
    info = stopped.info
    if stopped.processes == 0:
        console.print(f"the cluster at {info.address} (dashboard {info.dashboard_url}) had already stopped; forgot it")
    else:
        console.print(f"[green]stopped[/green] the Ray cluster at {info.address} (dashboard {info.dashboard_url})")
    console.print("start again with: rlkit cluster up")


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1]


def _print_info(info: cl.ClusterInfo) -> None:
    table = Table(title="Ray cluster", show_header=False, title_justify="left")
    table.add_row("address", info.address)
    table.add_row("dashboard", info.dashboard_url)
    table.add_row("temp dir", info.temp_dir or "-")
    table.add_row("started by", info.started_by)
    table.add_row("listens on", "127.0.0.1 only (single node)" if info.loopback else f"the network ({info.node_ip})")
    table.add_row("auth", "off: RAY_AUTH_MODE=disabled (the VS Code debugger sends no token); rlkit runs set it")
    console.print(table)


def _nodes_table(nodes: list[dict]) -> Table:
    table = Table(title="Nodes", title_justify="left")
    for col in ("node", "ip", "head", "state", "CPU", "GPU", "memory"):
        table.add_column(col)
    for n in nodes:
        res = n.get("resources_total") or {}
        table.add_row(
            str(n.get("node_id", ""))[:8],
            str(n.get("node_ip", "")),
            "yes" if n.get("is_head_node") else "",
            str(n.get("state", "")),
            f"{res.get('CPU', 0):g}",
            f"{res.get('GPU', 0):g}",
            f"{res.get('memory', 0) / 2**30:.1f} GiB",
        )
    return table


def _resources_table(usage: dict[str, tuple[float, float]]) -> Table:
    table = Table(title="Resources", title_justify="left")
    for col in ("resource", "used", "total"):
        table.add_column(col)
    for name, (used, total) in sorted(usage.items()):
        if "memory" in name.lower():
            table.add_row(name, f"{used / 2**30:.1f} GiB", f"{total / 2**30:.1f} GiB")
        else:
            table.add_row(name, f"{used:g}", f"{total:g}")
    return table


def _jobs_table(jobs: list[dict]) -> Table:
    running = [j for j in jobs if j.get("status") in ("RUNNING", "PENDING")]
    table = Table(title=f"Running jobs ({len(running)} of {len(jobs)})", title_justify="left")
    for col in ("job", "status", "debug", "entrypoint"):
        table.add_column(col)
    for j in running:
        env = (j.get("runtime_env") or {}).get("env_vars") or {}
        entry = str(j.get("entrypoint") or "")
        table.add_row(
            str(j.get("submission_id") or j.get("job_id") or ""),
            str(j.get("status", "")),
            str(env.get("RLKIT_DEBUG", "-")),
            entry if len(entry) <= 70 else "..." + entry[-67:],
        )
    return table
