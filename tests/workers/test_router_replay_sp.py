"""MoE routing replay under Ulysses sequence parallelism: each rank's routers see only its slice of the packed row
(the group's micro-batches together), so the routes must be gathered and sliced exactly as the tokens are. Two gloo
workers, a tiny Qwen3-MoE, routes that are not the model's own: the SP=2 forward and its gradients equal the
SP=1 (data-parallel) forward on the same routes, and the routes changed the log-probs; the routes captured for R2
under SP=2 are SP=1's."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.schema import FSDPConfig
from tests.gloo_workers import gloo_rank, run_on_gloo_workers
from tests.workers.test_ulysses import R, compare, rank_batch, step


def foreign_routes(batch: dict, experts: int, layers: int, seed: int) -> torch.Tensor:
    """(b, S, layers, 2) distinct random experts per token, -1 on padding."""
    g = torch.Generator().manual_seed(seed)
    shape = (*batch["input_ids"].shape, layers)
    first = torch.randint(0, experts, shape, generator=g)
    second = (first + torch.randint(1, experts, shape, generator=g)) % experts
    routes = torch.stack([first, second], dim=-1)
    routes[~batch["attention_mask"].bool()] = -1
    return routes


def _worker(rank: int, store_path: str, path: str, results) -> None:
    from rlkit.workers.fsdp_model import FSDPModel

    with gloo_rank(rank, store_path, results):
        batch = rank_batch(rank)
        valid = batch["response_mask"].bool()
        cpu = torch.device("cpu")
        dp = FSDPModel(path, FSDPConfig(), cpu)
        sp = FSDPModel(path, FSDPConfig(), cpu, ulysses_sequence_parallel_size=2)
        tap = dp.router_tap
        routes = foreign_routes(batch, tap.num_experts, len(tap.routers), seed=rank)
        own = step(dp, batch)
        with tap.recording():
            replayed = step(dp, batch, routed_experts=routes)
        assert torch.equal(torch.stack(tap.indices, dim=1), routes[batch["attention_mask"].bool()])
        assert not torch.allclose(own[0][valid], replayed[0][valid], atol=1e-3)
        compare(replayed, step(sp, batch, routed_experts=routes), valid, "moe/replay")
        # R2's capture: each rank's routers see part of the group's rows; the routes land at this rank's own rows
        from tests.workers.test_route_capture import capture

        assert torch.equal(capture(sp, batch, True, R)[1], capture(dp, batch, True, R)[1])


@pytest.mark.slow
def test_replay_under_sp2_matches_sp1(tmp_path):
    from rlkit.testing import save_tiny_moe

    path = save_tiny_moe(tmp_path / "moe", family="qwen3_moe", sharpen=1.0, hidden=128, heads=2, experts=4)
    run_on_gloo_workers(_worker, str(path), tmp_path)
