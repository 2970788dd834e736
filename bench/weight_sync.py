"""The separate engines' weight sync: the broadcast (rollout.weight_transfer=broadcast) against Ray's object store
(object_store), on one model, side by side in one Ray cluster.

    .venv/bin/python bench/weight_sync.py [--model smollm2-135m-instruct] [--syncs 5] [--bucket-mb 64]
        [--nodes 1|2] [--out bench/results/weight_sync.json]

The one-step-off layout (one actor worker, one vLLM engine of its own, 1 CPU each; `--nodes 2`: a two-node Ray
cluster on this machine, the engine on the second node). Each route pushes the actor's weights `--syncs` times
with `wait=True` (until the engine has loaded them). Per route: the sync's wall time (median), the bytes created
in the cluster's object stores per sync, and each call's peak RSS (the sender's and the engine's), against the
model's weight bytes. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def store_bytes_created() -> int:
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    state = get_state_from_address(ray.get_runtime_context().gcs_address)  # this driver's cluster, of any running
    return int(get_memory_info_reply(state).store_stats.cumulative_created_bytes)


def cluster(nodes: int):
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if nodes == 1:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        return None
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False)
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=64)
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    ap.add_argument("--data", default=str(Path("~/data/gsm8k/train.parquet").expanduser()))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "weight_sync.json"))
    args = ap.parse_args()

    from rlkit.models.resolve import resolve_model_path
    from rlkit.rollout.lifecycle import BroadcastRoute, ObjectStoreRoute
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.run.workers_setup import rl_workers

    model = str(resolve_model_path(args.model))
    c = cluster(args.nodes)
    cfg = load_config("grpo", [
        f"data.train_files={args.data}", f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=vllm",
        "trainer.one_step_off_policy=true", "trainer.n_gpus_per_node=1", "trainer.cpus_per_worker=1",
        "trainer.rollout_cpus_per_worker=1", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", f"actor_rollout_ref.rollout.nnodes={args.nodes - 1}",
        f"actor_rollout_ref.rollout.update_weights_bucket_megabytes={args.bucket_mb}", "trainer.logger=[]",
        "trainer.default_local_dir=/tmp/rlkit-bench-weight-sync",
    ])
    workers = rl_workers(cfg, model, total_steps=1)
    out: dict = {"model": args.model, "nodes": args.nodes, "bucket_mb": args.bucket_mb, "syncs": args.syncs,
                 "load": os.getloadavg(), "routes": {}}
    try:
        routes = {"broadcast": workers.weights, "object_store": ObjectStoreRoute(workers.actor, workers.rollout)}
        assert isinstance(routes["broadcast"], BroadcastRoute)
        for name, route in routes.items():
            route.push(wait=True)  # a first sync outside the timing
            workers.memory_peaks()
            seconds, created, metrics = [], [], {}
            for _ in range(args.syncs):
                before, start = store_bytes_created(), time.perf_counter()
                [metrics] = route.push(wait=True)
                seconds.append(time.perf_counter() - start)
                created.append(store_bytes_created() - before)
            peaks = {k: v for k, v in workers.memory_peaks().items() if k.endswith("rss_peak_gb")}
            out["routes"][name] = {"sync_s_median": statistics.median(seconds), "sync_s": seconds,
                                   "object_store_bytes_per_sync": statistics.median(created),
                                   "rss_peak_gb": peaks, "last_metrics": metrics}
        weight_mb = out["routes"]["broadcast"]["last_metrics"].get("perf/weight_broadcast_mb")
        out["weights_mb"] = weight_mb
    finally:
        workers.shutdown()
        import ray

        ray.shutdown()
        if c is not None:
            c.shutdown()
    print(f"{args.model}: {out['weights_mb']:.1f} MB of weights, {args.nodes} node(s), load {out['load'][0]:.1f}")
    print(f"{'route':14} {'sync s (median)':>16} {'object store MB/sync':>21}  peak RSS GB per call")
    for name, r in out["routes"].items():
        peaks = ", ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in sorted(r["rss_peak_gb"].items()))
        print(f"{name:14} {r['sync_s_median']:16.2f} {r['object_store_bytes_per_sync'] / 2**20:21.1f}  {peaks}")
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
