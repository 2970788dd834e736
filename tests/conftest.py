"""Shared fixtures (a local Ray instance) and the skip guard (tests/skip_guard.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.skip_guard import (  # noqa: F401  (hooks: an unlisted skip fails the run)
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the suite is calibrated in float32: on a CPU where bf16 is faster (AMX, AVX512-BF16), `param_dtype: auto` would
# train in bf16 (rlkit/utils/cpu_precision.py); tests of the bf16 path set it themselves
os.environ.setdefault("RLKIT_CPU_COMPUTE_DTYPE", "float32")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # two test processes share the two cores: one torch thread each (Ray workers and CLI runs inherit it), or their
    # OpenMP threads oversubscribe the cores and a run slows many times over
    os.environ.setdefault("OMP_NUM_THREADS", "1")

#: tests that bind the machine's default Ray ports (GCS 6379, dashboard 8265) as a user's `rlkit cluster up` does: the
#: suite runs them after the others, alone (scripts/test.sh)
SERIAL_DIRS = ("tests/debug/",)

# property tests draw the same examples on every machine (CI fails on a bug, not on a lucky draw);
# HYPOTHESIS_PROFILE=explore draws new ones, as a local bug hunt
settings.register_profile("rlkit", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "rlkit"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        if any(str(item.path.relative_to(root)).startswith(d) for d in SERIAL_DIRS):
            item.add_marker(pytest.mark.serial)


@pytest.fixture
def ray_local():
    """A local Ray (num_cpus=2), started on first use and kept for the session.

    Tests that need a different cluster shut it down themselves; the next test
    using this fixture starts it again.
    """
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray


@pytest.fixture(autouse=True, scope="session")
def _own_cluster_records(tmp_path_factory: pytest.TempPathFactory):
    """Runs in tests join the cluster `rlkit cluster up` recorded: keep a developer's own one out of them."""
    from rlkit.controller.cluster import STATE_ENV

    mp = pytest.MonkeyPatch()
    mp.setenv(STATE_ENV, str(tmp_path_factory.mktemp("rlkit-records") / "cluster.json"))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A 1-rank gloo group in this process (FSDP2 needs one); reuses one that already exists."""
    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        created = True
    yield
    if created:
        dist.destroy_process_group()
