"""`rlkit cluster up|join|status|down`: a long-lived Ray head to train on and debug against, and worker nodes for it."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rlkit.controller import cluster as cl
from rlkit.debug.listeners import LOOPBACK_ENV
from rlkit.debug.state import paused_workers, peek_where
from rlkit.utils import ray_token
from rlkit_cli.errors import friendly_errors

console = Console()
TOKEN_HELP = "The cluster's token file (default: the one `rlkit cluster up` made, for its cluster)."
EXIT = "Exit status: 0 done, 1 a user error (one line says what and the fix), 2 bad usage."


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Start, inspect and stop a Ray head (and worker nodes that join it)."
        " Example: [bold]rlkit cluster up --num-cpus 4[/bold]",
        no_args_is_help=True,
        rich_markup_mode="rich",
    )
    group.command("up")(up)
    group.command("join")(join)
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
        None, "--node-ip", help="Multi-node: Ray listens on this address so other nodes can join (token auth on)."
    ),
    listen_all: bool = typer.Option(
        False, "--listen-all", help="Multi-node: like --node-ip with the address Ray picks (token auth on)."
    ),
    token_file: str = typer.Option(
        None,
        "--token-file",
        help="Multi-node: the token file to use, made (0600) if missing"
        " (default: ~/.cache/rlkit/cluster_token, beside the cluster record).",
    ),
) -> None:
    """Start a Ray head with the dashboard (on 127.0.0.1 unless --dashboard-host says otherwise).

    Single node by default: every Ray service listens on 127.0.0.1 only and token auth is off (only this
    machine can connect; the VS Code debugger sends no token). With --listen-all or --node-ip the head
    listens on the network with Ray's token auth on: it makes the token file (0600) or reads it, prints
    its path (never the token) and the `rlkit cluster join` command for the other nodes. `rlkit train`
    and `rlkit debug` on this machine join this cluster while it is up, with the token
    (`--address local` keeps a run private).

    Example: [bold]rlkit cluster up --num-cpus 8 --num-gpus 2[/bold]   or   [bold]rlkit cluster up --listen-all[/bold]

    Exit status: 0 the head is up, 1 a user error (a port taken, a cluster already up; one line), 2 bad usage.
    """
    t0 = time.monotonic()
    default_token = token_file is None
    existed = Path(token_file or cl.default_token_file()).expanduser().exists()
    with console.status("starting the Ray head ..."):
        info = cl.start_cluster(num_cpus, num_gpus, port, dashboard_port, dashboard_host, temp_dir, node_ip=node_ip,
                                listen_all=listen_all, token_file=token_file)  # fmt: skip
    console.print(f"[green]Ray head up[/green] in {time.monotonic() - t0:.0f}s")
    _print_info(info)
    _print_exposure(info)
    if dashboard_host not in ("127.0.0.1", "localhost"):
        auth = "it asks for the token" if info.token_file else "token auth is off: anyone who can reach it can run code"
        console.print(
            f"[yellow]warning:[/yellow] the dashboard listens on {dashboard_host} ({auth});"
            " keep it on a trusted network, or on 127.0.0.1 and reach it through `ssh -L`."
        )
    join = ""
    if info.token_file:
        token = ray_token.read_token(info.token_file)
        made = "kept from before" if existed else "made now"
        console.print(f"token file: {info.token_file} (0600, {made}; fingerprint {ray_token.fingerprint(token)})",
                      soft_wrap=True, highlight=False)  # fmt: skip
        where = "" if default_token else f" --token-file {info.token_file}"
        join = (
            f"\n  other nodes:     copy {info.token_file} to the node (e.g. scp, keep it 0600), then there:"
            f"\n                   rlkit cluster join {info.address} --token-file FILE"
            f"\n  new token:       delete the file; the next `rlkit cluster up --listen-all{where}` makes one"
        )
    vscode = f"Ray Distributed Debugger view -> Add Cluster -> {_host_port(info.dashboard_url)}"
    if info.token_file:  # the dashboard answers 401 to a request without the token
        vscode = "the Ray Distributed Debugger extension sends no token: use the terminal (docs/multinode.md)"
    console.print(
        "\n[bold]Next:[/bold]\n"
        "  train on it:     rlkit train grpo ...   (joins this cluster; add --debug to debug workers)\n"
        f"  VS Code:         {vscode}\n"
        "  terminal:        rlkit debug list   /   rlkit debug attach\n"
        f"  own Ray scripts: {_script_env(info)} python my.py   (my.py: ray.init(address=\"{info.address}\")){join}\n"
        "  stop it:         rlkit cluster down",
        soft_wrap=True,
    )


def _script_env(info: cl.ClusterInfo) -> str:
    """What a plain Ray driver needs in its environment to connect (rlkit commands set it themselves)."""
    if info.token_file:
        env = ray_token.token_env(info.token_file)
    else:
        env = {**cl.AUTH_ENV, **(LOOPBACK_ENV if info.loopback else {})}
    return " ".join(f"{k}={v}" for k, v in env.items())


def _print_exposure(info: cl.ClusterInfo) -> None:
    """Say where Ray listens: loopback only, or that it is on the network (with token auth, if it is on)."""
    found = cl.cluster_listeners(info)
    open_ = [str(item) for item in found if not item.loopback]
    if not info.loopback and info.token_file:
        console.print(
            f"multi-node mode: Ray listens on the network (node IP {info.node_ip}) with token auth on (a client needs"
            " the token file); a paused worker's debugpy has no auth: keep the nodes on a trusted network.",
            soft_wrap=True,
        )
    elif not info.loopback:  # a record of an older rlkit: on the network without auth
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
def join(
    address: str = typer.Argument(..., help="The head's GCS address HOST:PORT (`rlkit cluster up` printed it)."),
    token_file: str = typer.Option(
        None,
        "--token-file",
        envvar=ray_token.PATH_ENV,
        show_envvar=True,
        help="A copy of the head's token file (0600). Else $RAY_AUTH_TOKEN (the token itself) is used.",
    ),
    num_cpus: float = typer.Option(None, "--num-cpus", help="CPUs to offer (default: all)."),
    num_gpus: float = typer.Option(None, "--num-gpus", help="GPUs to offer (default: all visible)."),
    node_ip: str = typer.Option(
        None, "--node-ip", help="This node's address as the others reach it (default: Ray's pick)."
    ),
    temp_dir: str = typer.Option(None, "--temp-dir", help="Ray temp dir (default: /tmp/rlkit-node-PORT)."),
) -> None:
    """Start a Ray worker node on this machine for a head that `rlkit cluster up --listen-all` started.

    The head runs with token auth: pass a copy of its token file. The token is checked against the head
    first; a wrong one fails in one line, before any Ray process starts. `rlkit cluster down` stops the node.

    Example: [bold]rlkit cluster join 10.0.0.1:6379 --token-file ~/cluster_token --num-gpus 8[/bold]

    Exit status: 0 the node joined, 1 a user error (no or wrong token, head unreachable; one line), 2 bad usage.
    """
    from rlkit.controller.cluster_join import join_cluster

    t0 = time.monotonic()
    with console.status(f"joining the Ray head at {address} ..."):
        info = join_cluster(address, token_file, num_cpus, num_gpus, node_ip, temp_dir)
    source = info.token_file or f"${ray_token.VALUE_ENV}"
    console.print(f"[green]joined[/green] the Ray cluster at {info.address} in {time.monotonic() - t0:.0f}s"
                  f" (token from {source}; temp dir {info.temp_dir})", soft_wrap=True, highlight=False)  # fmt: skip
    console.print("leave it: rlkit cluster down   (on the head: `rlkit cluster status` lists this node)")


@friendly_errors
def status(
    dashboard: str = typer.Option(None, "--dashboard", help="Dashboard URL (default: the cluster `up` started)."),
    token_file: str = typer.Option(None, "--token-file", envvar=ray_token.PATH_ENV, show_envvar=True, help=TOKEN_HELP),
) -> None:
    """Nodes, resources, running jobs and paused debug workers of the cluster.

    Example: [bold]rlkit cluster status[/bold]

    Exit status: 0 shown, 1 no cluster found or the dashboard refused (one line), 2 bad usage.
    """
    dash = cl.open_dashboard(dashboard, token_file)
    url = dash.url
    info = cl.running_cluster()
    if info is not None and info.dashboard_url == url:
        _print_info(info)
    else:
        console.print(f"dashboard: {url}")
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
    """Stop the cluster `rlkit cluster up` started and the node `rlkit cluster join` started here (only their
    processes; other Ray clusters are left alone). The token file stays, for the next `up`.

    Nothing to stop is not an error (exit 0).

    Example: [bold]rlkit cluster down[/bold]

    Exit status: 0 stopped or nothing to stop, 1 an unreadable record (one line), 2 bad usage.
    """
    from rlkit.controller.cluster_join import leave_cluster

    with console.status("stopping ..."):
        left = leave_cluster()
        stopped = cl.stop_cluster()
    if left is not None:
        what = "stopped" if left.processes else "had already stopped; forgot"
        console.print(f"worker node of the cluster at {left.info.address}: {what} it", highlight=False)
    if stopped is None:
        if left is None:
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
    if info.token_file:
        table.add_row("auth", f"token (RAY_AUTH_MODE=token), file {info.token_file}; rlkit runs pass it")
    else:
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
