"""The group's master port: held from the moment it is chosen until rank 0's store takes it over."""

from __future__ import annotations

import datetime
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlkit.controller.worker import rendezvous_store, reserve_master_port


def _both_ranks(port: int) -> tuple:
    """Rank 0's store waits for rank 1 as it is built: build them side by side, as two workers would."""
    timeout = datetime.timedelta(seconds=30)
    with ThreadPoolExecutor(2) as pool:
        ranks = [pool.submit(rendezvous_store, "127.0.0.1", port, rank, 2, timeout) for rank in (0, 1)]
        return ranks[0].result(), ranks[1].result()


def test_a_reserved_port_cannot_be_taken_and_rank_0_store_serves_on_it():
    port = reserve_master_port("127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:  # another process picking the same port
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
    server, client = _both_ranks(port)
    server.set("hello", "rank0")
    assert client.get("hello") == b"rank0"


def test_an_unreserved_port_is_bound_by_rank_0_itself():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server, client = _both_ranks(port)
    client.set("k", "v")
    assert server.get("k") == b"v"
