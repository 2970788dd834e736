"""`rlkit train` across nodes (issue 47 items 2 and 4), on a real two-node Ray cluster on this machine
(`ray.cluster_utils.Cluster`: two raylets, one CPU each): the toy GRPO run with `trainer.nnodes=2` puts one
rank on each node (recorded in the run's status.json), checkpoints, and a second run resumes from it; then
the second node's raylet is killed mid-run: the death is reported by node, no restart fits the placement any
more, and the run ends with the death (the CLI's resume line) with the last complete checkpoint intact.

The two tests share the cluster; the node-loss one runs last (it removes the node).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal

import pytest
import ray
import torch
from ray.cluster_utils import Cluster

from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.step.rl_trainer import RLTrainer
from rlkit.utils.checkpoint_io import find_latest_checkpoint, is_complete
from tests.trainer.conftest import toy_overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    # Ray notices a lost node at its health checks: every second here, three misses (default 3 s x 5)
    checks = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": checks})
    second = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        yield cluster, second
    finally:
        ray.shutdown()
        cluster.shutdown()


def _cfg(toy_data, tiny_model, tmp_path, **extra):
    values = dict(trainer__nnodes=2, trainer__n_gpus_per_node=1, trainer__save_freq=2, actor_rollout_ref__rollout__n=4,
                  data__train_batch_size=8, actor_rollout_ref__actor__ppo_mini_batch_size=8)
    return load_config("grpo", toy_overrides(toy_data, tiny_model, tmp_path, **(values | extra)))


def test_toy_grpo_trains_across_two_nodes_and_resumes(two_nodes, toy_data, tiny_model, tmp_path):
    cfg = _cfg(toy_data, tiny_model, tmp_path, trainer__total_training_steps=2)
    trainer = RLTrainer(cfg)
    try:
        assert trainer.fit().steps == 2
        status = json.loads((tmp_path / "ckpt" / "status.json").read_text())
    finally:
        trainer.workers.shutdown()
    ranks = {w["rank"]: w["node"] for w in status["workers"]}
    assert sorted(ranks) == [0, 1] and len(set(ranks.values())) == 2, status["workers"]  # one rank per node
    assert {w["node"] for w in status["workers"]} == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    checkpoint = find_latest_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and checkpoint.name == "global_step_2" and is_complete(checkpoint)

    resumed = RLTrainer(_cfg(toy_data, tiny_model, tmp_path, trainer__total_training_steps=3,
                             trainer__resume_mode="auto"))
    try:
        summary = resumed.fit()
    finally:
        resumed.workers.shutdown()
    assert summary.steps == 3 and len(summary.step_seconds) == 1  # went on from step 2, not from the start


def store_bytes_created() -> int:
    """Bytes ever created in the cluster's object stores (every raylet's plasma store, summed by Ray)."""
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    state = get_state_from_address(ray.get_runtime_context().gcs_address)  # this driver's cluster, of any running
    return int(get_memory_info_reply(state).store_stats.cumulative_created_bytes)


def test_one_step_off_engines_on_a_node_of_their_own_get_weights_by_broadcast(two_nodes, toy_data, tiny_model,
                                                                               tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.rollout.hf_rollout import HFRollout
    from rlkit.rollout.lifecycle import BroadcastRoute, ObjectStoreRoute
    from rlkit.trainer.step.rollout_source import PROMPT_KEYS

    cfg = _cfg(toy_data, tiny_model, tmp_path, trainer__nnodes=1, trainer__one_step_off_policy=True,
               trainer__rollout_cpus_per_worker=1, actor_rollout_ref__rollout__nnodes=1,
               actor_rollout_ref__rollout__update_weights_bucket_megabytes=0.05, trainer__total_training_steps=2,
               trainer__save_freq=-1)
    trainer = RLTrainer(cfg)
    try:
        assert trainer.fit().steps == 2
        w = trainer.workers
        actor_nodes, engine_nodes = ({n["node_id"] for n in g.nodes} for g in w.groups)
        assert actor_nodes and engine_nodes and actor_nodes.isdisjoint(engine_nodes)  # a node of their own
        assert isinstance(w.weights, BroadcastRoute)
        before = store_bytes_created()
        [sync] = w.sync_weights(wait=True)
        broadcast_store = store_bytes_created() - before
        model_mb = sync["perf/weight_broadcast_mb"]
        assert model_mb > 0 and sync["perf/weight_broadcast_buckets"] > 1, sync  # 50 kB buckets: several
        before = store_bytes_created()
        ObjectStoreRoute(w.actor, w.rollout).push(wait=True)  # the same weights through Ray's object store
        object_store = store_bytes_created() - before
        print(f"weights {model_mb:.2f} MB; object store bytes created: broadcast {broadcast_store}, "
              f"object store route {object_store}")
        assert object_store >= 0.9 * model_mb * 2**20  # the object-store route carries the weights ...
        assert broadcast_store < 0.01 * model_mb * 2**20  # ... the broadcast none of them
        # the engine after the broadcast generates as a fresh engine loaded from the actor's weights does
        state = next(s for s in w.actor.full_state_dict() if s is not None)
        fresh = tmp_path / "fresh"
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
        model.load_state_dict(state)
        model.save_pretrained(fresh)
        AutoTokenizer.from_pretrained(str(tiny_model)).save_pretrained(fresh)
        w.sync_weights(wait=True)
        prompts = next(trainer.rollout_ctx.prompts).select(PROMPT_KEYS)
        synced = w.rollout.generate_sequences(prompts, greedy=True)
        rollout_cfg = cfg.actor_rollout_ref.rollout
        engine = HFRollout(fresh, rollout_cfg)
        expected = engine.generate(prompts, rollout_cfg.to_sampling(greedy=True))
        assert torch.equal(synced["responses"], expected["responses"])
        torch.testing.assert_close(synced["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-5, rtol=0)
    finally:
        trainer.workers.shutdown()


class KillNodeAt:
    """A tracker that takes the cluster's second node away once step `at` is logged, as a lost machine goes: its
    raylet and every worker process on it killed."""

    def __init__(self, cluster: Cluster, node, at: int) -> None:
        self.cluster, self.node, self.at = cluster, node, at
        self.trainer = None

    def log(self, data: dict, step: int) -> None:
        if step != self.at:
            return
        pids = [pid for g in self.trainer.workers.groups for pid, n in zip(g.pids, g.nodes)
                if n["node_id"] == self.node.node_id]
        self.cluster.remove_node(self.node, allow_graceful=False)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_lost_node_is_named_and_the_run_ends_on_its_last_checkpoint(two_nodes, toy_data, tiny_model, tmp_path,
                                                                     caplog):
    cluster, second = two_nodes
    cfg = _cfg(toy_data, tiny_model, tmp_path, trainer__total_training_steps=4, trainer__max_worker_restarts=1)
    kill = KillNodeAt(cluster, second, at=3)
    trainer = RLTrainer(cfg, tracker=kill)
    kill.trainer = trainer
    try:
        with caplog.at_level(logging.ERROR), pytest.raises((ray.exceptions.RayError, Exception)) as err:
            trainer.fit()
    finally:
        trainer.workers.shutdown()
    assert not isinstance(err.value, AssertionError)
    text = caplog.text
    assert "left the cluster" in text and f"{second.node_id[:8]}" in text, text  # the death names the lost node
    assert "not restarting: resource pool" in text and "needs 2 nodes" in text, text  # no placement fits now
    checkpoint = find_latest_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and checkpoint.name == "global_step_2" and is_complete(checkpoint)  # nothing lost
