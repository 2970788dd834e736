"""One real Ray head (via `rlkit cluster up`) shared by the debug tests, plus a debug-mode driver.

Private ports, temp dir and state file: other people run Ray clusters on the same machine,
and we stop only our own processes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from rlkit.controller import cluster as cl
from rlkit.controller.processes import free_ports, stop_processes
from tests.debug._runs import Toy


@dataclass
class ClusterHandle:
    info: cl.ClusterInfo
    port: int
    dashboard_port: int
    temp_dir: str
    state_file: str
    up_output: str


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    from rlkit_cli.main import app

    state_file = str(tmp_path_factory.mktemp("state") / "cluster.json")
    temp_dir = tempfile.mkdtemp(prefix="rlk-", dir="/tmp")  # short: Ray puts Unix sockets in it
    port, dashboard_port = free_ports(2)
    mp = pytest.MonkeyPatch()
    mp.setenv(cl.STATE_ENV, state_file)
    mp.setenv("RAY_AUTH_MODE", "disabled")
    mp.delenv("RLKIT_DASHBOARD", raising=False)
    args = ["cluster", "up", "--num-cpus", "4", "--port", str(port), "--dashboard-port", str(dashboard_port)]
    result = CliRunner().invoke(app, [*args, "--temp-dir", temp_dir])
    try:
        assert result.exit_code == 0, result.output
        info = cl.load_state()
        assert info is not None
        yield ClusterHandle(info, port, dashboard_port, temp_dir, state_file, result.output)
    finally:
        _shutdown_driver()
        stop_processes(temp_dir, gcs_port=port)  # the port finds Ray's client server (no temp dir in its args)
        mp.undo()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def driver(cluster: ClusterHandle) -> Iterator[object]:
    """This test process as a Ray driver in debug mode ("on"), like `rlkit train --debug`."""
    import cloudpickle
    import ray

    from rlkit.debug import debug_runtime_env
    from rlkit.debug.listeners import SINGLE_NODE_ENV
    from tests.debug import _targets

    _shutdown_driver()
    # A driver of a loopback cluster runs Ray in single-node mode, else Ray rewrites 127.0.0.1 to the
    # network address (rlkit.debug.listeners); undone afterwards so later tests get Ray's default.
    mp = pytest.MonkeyPatch()
    mp.setenv(SINGLE_NODE_ENV, "0")
    mp.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    cloudpickle.register_pickle_by_value(_targets)  # workers need not import the tests package
    ray.init(address=cluster.info.address, runtime_env=debug_runtime_env("on"), log_to_driver=False)
    try:
        yield ray
    finally:
        _shutdown_driver()
        mp.undo()


def _shutdown_driver() -> None:
    import ray

    from rlkit.debug import restore_driver_breakpoint

    if ray.is_initialized():
        ray.shutdown()
    restore_driver_breakpoint()  # ray.init pointed this process's breakpoint() at debugpy


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toy]:
    """Toy parquet + a tiny model for `rlkit train` runs (README's two-minute run, smaller)."""
    from rlkit.testing import save_tiny_model
    from rlkit_cli.main import app

    root = tmp_path_factory.mktemp("toy")
    made = CliRunner().invoke(app, ["data", "toy", "--out", str(root), "--length", "1"])
    assert made.exit_code == 0, made.output
    save_tiny_model(str(root / "model"), tie_embeddings=True)
    mp = pytest.MonkeyPatch()
    state_file = root / "cluster.json"
    mp.setenv(cl.STATE_ENV, str(state_file))  # `rlkit debug list` in this process reads the run's record
    mp.delenv("RLKIT_DASHBOARD", raising=False)
    try:
        yield Toy(root, state_file)
    finally:
        mp.undo()
