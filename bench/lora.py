"""Full fine-tuning vs LoRA (rank 8 / 32) on one actor: step time, weight-sync time, peak RSS.

    .venv/bin/python bench/lora.py                              # SmolLM2-135M, hf engine, 3 steps
    .venv/bin/python bench/lora.py --rollout vllm --ranks 8     # + vLLM merge and native sync
    .venv/bin/python bench/lora.py --model ./tiny --steps 2     # any HF folder or alias

Each configuration runs in a fresh subprocess (so peak RSS is its own) and does what a colocated
GRPO worker does with the model, without Ray, data or reward:

  build      the actor (FSDPModel, float32 on CPU), with a reference model when full fine-tuning needs
             one for the KL loss (LoRA: the actor with its adapter off), and the rollout engine
  step       per step, on `--rows` sequences of `--prompt-length` + `--response-length` random tokens:
             old log-probs (no grad), reference log-probs (no grad), one PPO-style update
             (forward + backward + AdamW step over the trained parameters)
  sync       the engine loads the actor's weights: merge = the full merged state dict (base names),
             native (vllm only) = the adapter alone as a LoRARequest

Reported: median step and sync seconds over steps 2..N, the trained parameter count, optimizer state
and gradient MB (what LoRA shrinks), and the process's peak RSS (ru_maxrss: model + reference +
engine copy + optimizer + activations). A table on stdout, JSON in bench/results/lora.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="HF folder / alias")
    p.add_argument("--ranks", default="0,8,32", help="LoRA ranks to compare (0 = full fine-tuning)")
    p.add_argument("--rollout", default="hf", choices=["hf", "vllm"], help="engine to sync into")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=8, help="sequences per step")
    p.add_argument("--prompt-length", type=int, default=64)
    p.add_argument("--response-length", type=int, default=64)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora.json"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # child: run one configuration "rank:sync"
    return p.parse_args(argv)


def configurations(args: argparse.Namespace) -> list[tuple[int, str]]:
    out = []
    for rank in (int(r) for r in args.ranks.split(",")):
        out.append((rank, "merge"))
        if rank > 0 and args.rollout == "vllm":
            out.append((rank, "native"))
    return out


# ---------------------------------------------------------------------------- child
def run_one(args: argparse.Namespace, rank: int, sync: str) -> dict:
    import torch

    import rlkit.rollout  # noqa: F401  (registers the backends)
    from rlkit.config.rollout import RolloutConfig
    from rlkit.config.schema import FSDPConfig, ModelConfig, OptimConfig
    from rlkit.models.resolve import resolve_model_path
    from rlkit.rollout.base import ROLLOUT_BACKENDS
    from rlkit.rollout.lifecycle import ActorAdapter, ActorWeights, EngineLifecycle
    from rlkit.workers.fsdp_model import FSDPModel

    torch.manual_seed(0)
    path = str(resolve_model_path(args.model))
    device = torch.device("cpu")
    model_cfg = ModelConfig(path=path, lora_rank=rank, lora_alpha=2 * rank)
    start = time.perf_counter()
    actor = FSDPModel(path, FSDPConfig(), device, lora=model_cfg if rank else None)
    actor.setup_optimizer(OptimConfig(lr=1e-5), total_steps=args.steps)
    ref = None if rank else FSDPModel(path, FSDPConfig(), device)  # full fine-tuning: a second copy
    length = args.prompt_length + args.response_length
    rollout_cfg = RolloutConfig(
        name=args.rollout,
        prompt_length=args.prompt_length,
        response_length=args.response_length,
        lora_sync=sync,
        max_lora_rank=rank,
        kv_cache_memory_mb=64,
    )
    engine = ROLLOUT_BACKENDS.get(args.rollout)(path, rollout_cfg)
    holder = type("Actor", (), {})()
    holder.model = actor

    def adapter_state():
        from rlkit.models.lora import adapter_state_dict

        return actor.lora.config.to_dict(), adapter_state_dict(actor.iter_wrapped_params(adapter_only=True))

    holder.adapter_state = adapter_state
    source = ActorAdapter(holder) if sync == "native" else ActorWeights(holder)
    life = EngineLifecycle(engine, free_cache_engine=False, source=source)
    build_s = time.perf_counter() - start

    vocab = actor.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    steps = []
    for _ in range(args.steps):
        ids = torch.randint(10, vocab, (args.rows, length), generator=gen)
        mask = torch.ones_like(ids)
        pos = mask.cumsum(1) - 1
        r = args.response_length
        t0 = time.perf_counter()
        actor.module.eval()
        with torch.no_grad():
            old = actor.forward(ids, mask, pos, r).log_probs
            if ref is not None:
                ref.forward(ids, mask, pos, r)
            else:
                with actor.lora.disabled():
                    actor.forward(ids, mask, pos, r)
        actor.module.train()
        new = actor.forward(ids, mask, pos, r).log_probs
        ratio = torch.exp(new - old)
        (-(ratio * torch.randn_like(ratio)).mean()).backward()
        actor.clip_and_step(1.0)
        t1 = time.perf_counter()
        loaded = life.load()
        t2 = time.perf_counter()
        steps.append({"step_s": t1 - t0, "sync_s": t2 - t1, "sync_mb": loaded["perf/update_weights_mb"]})
    timed = steps[1:] or steps
    memory = actor.memory_report()
    if hasattr(engine, "close"):
        engine.close()
    return {
        "rank": rank,
        "sync": sync,
        "rollout": args.rollout,
        "step_s": statistics.median(s["step_s"] for s in timed),
        "sync_s": statistics.median(s["sync_s"] for s in timed),
        "sync_mb": timed[-1]["sync_mb"],
        "build_s": build_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "reference": "second model" if ref is not None else "actor, adapter off",
        **memory,
        "per_step": steps,
    }


# --------------------------------------------------------------------------- parent
def print_table(results: list[dict], args: argparse.Namespace, load: tuple[float, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"LoRA vs full fine-tuning: {args.model}, {args.rows} x {args.prompt_length}+"
        f"{args.response_length} tokens, {args.rollout} engine, median of steps 2..{args.steps}",
        caption=f"load average (1 min) before / after: {load[0]:.1f} / {load[1]:.1f}",
    )
    for col in ("run", "trained params", "optim state MB", "grads MB", "step s", "sync s", "sync MB", "peak RSS MB"):
        table.add_column(col, justify="right" if col != "run" else "left")
    for r in results:
        name = "full fine-tuning" if r["rank"] == 0 else f"LoRA r={r['rank']} ({r['sync']})"
        table.add_row(
            name,
            f"{r['trainable_params'] / 1e6:.2f}M",
            f"{r['optimizer_state_mb']:.1f}",
            f"{r['grad_mb']:.1f}",
            f"{r['step_s']:.2f}",
            f"{r['sync_s']:.3f}",
            f"{r['sync_mb']:.1f}",
            f"{r['peak_rss_mb']:.0f}",
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.one:
        rank, sync = args.one.split(":")
        print("RESULT " + json.dumps(run_one(args, int(rank), sync)), flush=True)
        return []
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONPATH=str(ROOT))
    load_before = os.getloadavg()[0]
    results = []
    for rank, sync in configurations(args):
        cmd = [sys.executable, __file__, "--one", f"{rank}:{sync}", *(argv if argv is not None else sys.argv[1:])]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{rank}:{sync} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        results.append(json.loads(line[len("RESULT ") :]))
        print(f"done: rank {rank} {sync}", file=sys.stderr, flush=True)
    load = (load_before, os.getloadavg()[0])
    print_table(results, args, load)
    import torch

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "workload": {k: v for k, v in vars(args).items() if k not in ("one", "out")},
                "results": results,
                "env": {
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "cpus": os.cpu_count(),
                    "omp_threads": env["OMP_NUM_THREADS"],
                    "load_avg_1m_before_after": load,
                },
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
