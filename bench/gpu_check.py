"""The prepared device check: the CUDA paths that CPU CI cannot run, in one short script.

    python bench/gpu_check.py --host inprocess     # the lent GPU machine (no Ray, no vLLM): docs/gpu.md
    python bench/gpu_check.py --host inprocess --device cpu    # the same on CPU/gloo, a tiny model (CI runs it)
    python bench/gpu_check.py                      # a GPU cluster with Ray + vLLM: NCCL + bf16 + GRPO step + vLLM sync
    python bench/gpu_check.py --device cpu         # the same checks on CPU/gloo

`--host inprocess` runs rlkit's worker roles in this process (bench/_gpu_inprocess.py says what it checks:
env, numerics, grpo_step, weight_sync); without it (`--host ray`), the checks below.

Four checks, each printed as a row of one table and written to JSON (`--out`):

1. `env`: torch/CUDA versions, device name, the imports rlkit needs.
2. `numerics`: FSDP2 (NCCL on CUDA, gloo on CPU; world of 1) in the trainer's compute dtype
   (bf16 on GPU by `param_dtype=auto`) computes response log-probs of a fixed batch through
   `FSDPModel.forward` (packed, response-only logits); the reference is the plain transformers
   model in float32 on CPU. bf16 passes at mean |diff| < 0.05 nats and max < 0.5; float32 at 1e-4.
3. `grpo_step`: `bench/grpo_step.py` (the real trainer on Ray, HF rollout, one worker per GPU)
   on a random ~100M Llama (hidden 768, 12 layers: no weights can be downloaded there), 3 steps;
   reports step time, phases and `perf/mfu` against the device's spec peak.
4. `vllm_sync`: the hybrid engine's weight sync into vLLM (trainer and engine in one process, as in a
   colocated worker), at sleep levels 1 and 2: sleep, the trainer's weights change, then
   `EngineLifecycle` wakes the weights, loads, wakes the KV cache and generates; the engine's log-probs
   must equal the trainer's (the dtype's tolerance) and differ from the previous weights'; the call
   order is checked, and on GPU that sleeping frees device memory (vLLM sleep mode).

The model is random (nothing to download); the tokenizer is rlkit's tiny word-level one, so the
vocabulary is small and the LM head cheap: MFU here measures the decoder, not a 150k-vocab head.
Exit status: 0 all checks passed, 1 a check failed (the table says which), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOLERANCE = {"bfloat16": (0.05, 0.5), "float32": (1e-4, 1e-3)}  # (mean, max) |log-prob diff| in nats


def check_env(device: str) -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        info.update(cuda=torch.version.cuda, devices=torch.cuda.device_count(), name=torch.cuda.get_device_name(0),
                    nccl=".".join(map(str, torch.cuda.nccl.version())), bf16=torch.cuda.is_bf16_supported())
    missing = []
    for mod in ("ray", "transformers", "omegaconf", "typer", "rich", "pyarrow"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    info["missing_imports"] = missing
    ok = not missing and (device == "cpu" or torch.cuda.is_available())
    return {"ok": ok, **info}


def _fixed_batch(vocab: int, rows: int = 8, prompt: int = 24, response: int = 40):
    """Left-padded prompts + right-padded responses, like the trainer's batches."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    for r in range(rows):
        mask[r, : r % 5] = 0  # left padding
        mask[r, prompt + response - (r % 7):] = 0  # right padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, response


def _reference_log_probs(model_path: Path, ids, mask, pos, response: int):
    """Plain transformers, float32, CPU, padded: the numbers the trainer must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -response - 1: -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -response:, None]).squeeze(-1)


def check_numerics(model_path: Path, device: str, dtype: str) -> dict:
    import torch
    import torch.distributed as dist

    from rlkit.config.schema import FSDPConfig
    from rlkit.controller.worker import PROCESS_GROUP_BACKENDS, free_port
    from rlkit.workers.fsdp_model import FSDPModel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    backend = PROCESS_GROUP_BACKENDS[device]  # as a worker makes its group (CPU tensors over gloo on a GPU too)
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        model = FSDPModel(str(model_path), FSDPConfig(param_dtype=dtype), torch.device(device, 0)
                          if device == "cuda" else torch.device("cpu"))
        ids, mask, pos, response = _fixed_batch(model.config.vocab_size)
        with torch.no_grad():
            start = time.perf_counter()
            out = model.forward(ids, mask, pos, response)
            fwd_s = time.perf_counter() - start
        got = out.log_probs.float().cpu()
    finally:
        dist.destroy_process_group()
    ref = _reference_log_probs(model_path, ids, mask, pos, response)
    valid = mask[:, -response:].bool()
    diff = (got - ref).abs()[valid]
    mean_tol, max_tol = TOLERANCE[dtype]
    return {"ok": bool(diff.mean() < mean_tol and diff.max() < max_tol), "backend": backend, "dtype": dtype,
            "mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()), "tolerance": [mean_tol, max_tol],
            "forward_s": fwd_s, "tokens": int(valid.sum())}


def check_grpo_step(model_path: Path, device: str, steps: int, out_dir: Path) -> dict:
    import torch

    workers = torch.cuda.device_count() if device == "cuda" else 1
    out = out_dir / "grpo_step.json"
    cmd = [sys.executable, str(ROOT / "bench" / "grpo_step.py"), "--model", str(model_path), "--rollout", "hf",
           "--steps", str(steps), "--workers", str(workers), "--prompts", "8", "--n", "8", "--response-length", "256",
           "--micro-batch", "16", "--out", str(out), "--set", f"trainer.device={device}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0 or not out.exists():
        return {"ok": False, "returncode": proc.returncode, "stderr_tail": proc.stderr[-3000:]}
    res = json.loads(out.read_text())
    return {"ok": True, "workers": workers, "step_s": res["step_s"], "phases_s": res["phases_s"], "mfu": res["mfu"],
            "tokens_per_s": res["tokens_per_s"], "gen_tokens_per_s": res["gen_tokens_per_s"]}


SYNC_PROMPT, SYNC_RESPONSE, SYNC_ROWS = 16, 32, 8


def _prompt_batch(vocab: int):
    """Left-padded random prompts as the dataset hands them to the rollout."""
    import torch

    from rlkit.protocol import Batch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (SYNC_ROWS, SYNC_PROMPT), generator=g)
    mask = torch.ones_like(ids)
    for r in range(SYNC_ROWS):
        mask[r, : r % 4] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def _perturb(trainer, seed: int, scale: float = 0.5) -> None:
    """A new policy: every trainer parameter moved by `scale` relative noise (stands in for an update)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainer.module.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            noise = torch.randn(local.shape, generator=g).to(local.device, local.dtype)
            local.add_(noise * (scale * local.float().abs().mean()).to(local.dtype))


def _trainer_gap(trainer, out):
    """|engine log-prob - trainer log-prob| over the generated tokens of `out`."""
    import torch

    dev = trainer.device
    with torch.no_grad():
        lp = trainer.forward(out["input_ids"].to(dev), out["attention_mask"].to(dev), out["position_ids"].to(dev),
                             out["responses"].shape[1]).log_probs.float().cpu()
    return (lp - out["rollout_log_probs"]).abs()[out["response_mask"].bool()]


def _record(engine, device: str) -> tuple[list, list]:
    """Record the lifecycle's calls into the engine (and free device memory while it generates)."""
    import torch

    calls: list = []
    awake_free: list = []
    for name in ("sleep", "wake_up", "update_weights", "generate"):
        real = getattr(engine, name)

        def wrapper(*args, _name=name, _real=real, **kwargs):
            calls.append([_name, *[a for a in args if isinstance(a, int | list)]])
            if _name == "generate" and device == "cuda":
                awake_free.append(torch.cuda.mem_get_info()[0])
            return _real(*args, **kwargs)

        setattr(engine, name, wrapper)
    return calls, awake_free


def check_vllm_sync(model_path: Path, device: str, dtype: str, cycles: int) -> dict:
    """The hybrid engine's sync on vLLM: trainer (FSDP2) and engine in one process, as in a colocated worker.

    For sleep levels 1 and 2, `cycles` times: the trainer's weights change, the sleeping engine gets them
    through `EngineLifecycle` (wake weights -> load -> wake KV cache -> generate -> sleep), and the engine's
    log-probs of what it generated must equal the trainer's (dtype tolerance) and differ from the previous
    weights' (the sync did something). Then one generation without a sync (validation): after a level-2 sleep
    on GPU the lifecycle reloads the discarded weights from the trainer first. Checks the call order, and on
    GPU that sleeping frees device memory."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from rlkit.config.schema import FSDPConfig
    from rlkit.controller.worker import PROCESS_GROUP_BACKENDS, free_port
    from rlkit.rollout import RolloutConfig, SamplingConfig, VLLMRollout
    from rlkit.rollout.lifecycle import ActorWeights, EngineLifecycle
    from rlkit.workers.fsdp_model import FSDPModel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(PROCESS_GROUP_BACKENDS[device], rank=0, world_size=1)
    mean_tol, max_tol = TOLERANCE[dtype]
    report: dict = {"dtype": dtype, "tolerance": [mean_tol, max_tol], "levels": {}}
    try:
        trainer = FSDPModel(str(model_path), FSDPConfig(param_dtype=dtype),
                            torch.device("cuda", 0) if device == "cuda" else torch.device("cpu"))
        trainer.module.eval()
        rollout = RolloutConfig(name="vllm", prompt_length=SYNC_PROMPT, response_length=SYNC_RESPONSE, dtype=dtype,
                                calculate_log_probs=True, kv_cache_memory_mb=64, gpu_memory_utilization=0.3,
                                max_num_seqs=SYNC_ROWS)
        start = time.perf_counter()
        engine = VLLMRollout(model_path, rollout)
        report["engine_start_s"] = round(time.perf_counter() - start, 1)
        calls, awake_free = _record(engine, device)
        source = ActorWeights(SimpleNamespace(model=trainer))  # the colocated actor's weights
        prompts = _prompt_batch(trainer.config.vocab_size)
        ok = True
        try:
            for level in (1, 2):
                life = EngineLifecycle(engine, free_cache_engine=True, sleep_level=level, source=source)
                calls.clear()
                life.start()
                row: dict = {"fresh_mean": [], "fresh_max": [], "stale_mean": [], "asleep_free_gb": [],
                             "order_ok": calls == [["sleep", level]]}
                previous = None
                for cycle in range(cycles + 1):
                    calls.clear()
                    sync = cycle < cycles  # the last round generates without a sync (validation)
                    if sync:
                        _perturb(trainer, seed=100 * level + cycle)
                        life.load()
                    sampling = SamplingConfig(response_length=SYNC_RESPONSE, calculate_log_probs=True, seed=cycle)
                    out, _ = life.generate(prompts, sampling)
                    if device == "cuda":
                        row["asleep_free_gb"].append(torch.cuda.mem_get_info()[0] / 2**30)
                    load = ["wake_up", ["weights"]], ["update_weights"]
                    reload = sync or engine.discards_weights(level)
                    expected = [*(load if reload else load[:1]), ["wake_up", ["kv_cache"]], ["generate"],
                                ["sleep", level]]
                    row["order_ok"] = row["order_ok"] and calls == expected
                    fresh = _trainer_gap(trainer, out)
                    row["fresh_mean"].append(float(fresh.mean()))
                    row["fresh_max"].append(float(fresh.max()))
                    if previous is not None and sync:  # the last weights' samples, scored by the new trainer
                        row["stale_mean"].append(float(_trainer_gap(trainer, previous).mean()))
                    previous = out
                engine.wake_up()  # awake for the next level's start()
                fresh_ok = max(row["fresh_mean"]) < mean_tol and max(row["fresh_max"]) < max_tol
                stale_ok = min(row["stale_mean"]) > 5 * max(row["fresh_mean"])
                freed = (min(row["asleep_free_gb"]) - max(awake_free) / 2**30) if device == "cuda" else None
                row.update(fresh_ok=fresh_ok, stale_ok=stale_ok, sleep_frees_gb=freed)
                ok = ok and fresh_ok and stale_ok and row["order_ok"] and (freed is None or freed > 0)
                awake_free.clear()
                report["levels"][level] = row
        finally:
            engine.close()
    finally:
        dist.destroy_process_group()
    return {"ok": ok, **report}


CHECKS = ("env", "numerics", "grpo_step", "vllm_sync")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", choices=["ray", "inprocess"], default="ray",
                    help="inprocess: the roles in this process, no Ray or vLLM needed (the lent GPU machine)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=list(TOLERANCE), default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {CHECKS}")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=3, help="vllm_sync: weight updates per sleep level")
    ap.add_argument("--hidden", type=int, default=768, help="random model width (heads = hidden / 64)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"), "gpu_check.json"))
    args = ap.parse_args(argv)
    if args.host == "inprocess":
        return _inprocess(args)
    checks = args.checks.split(",")
    if unknown := set(checks) - set(CHECKS):
        print(f"unknown checks {sorted(unknown)}; choose from {CHECKS}", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="rlkit-gpu-check-") as tmp:
        from rlkit.testing import save_tiny_model

        model = save_tiny_model(Path(tmp) / "model", hidden_size=args.hidden, layers=args.layers,
                                heads=max(1, args.hidden // 64), tie_embeddings=True)
        runners = {
            "env": lambda: check_env(args.device),
            "numerics": lambda: check_numerics(model, args.device, dtype),
            "grpo_step": lambda: check_grpo_step(model, args.device, args.steps, Path(tmp)),
            "vllm_sync": lambda: check_vllm_sync(model, args.device, dtype, args.cycles),
        }
        for name in checks:
            start = time.perf_counter()
            try:
                results[name] = runners[name]()
            except Exception:  # a failed check is a result, the others still run
                results[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
            results[name]["seconds"] = round(time.perf_counter() - start, 1)
            print(f"{name:10s} {'ok' if results[name]['ok'] else 'FAILED':6s} "
                  f"{json.dumps({k: v for k, v in results[name].items() if k != 'ok'}, default=str)[:600]}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": args.device, "dtype": dtype, "results": results}, indent=1, default=str))
    print(f"wrote {out}")
    return 0 if all(r["ok"] for r in results.values()) else 1


def _inprocess(args: argparse.Namespace) -> int:
    """`--host inprocess`: bench/_gpu_inprocess.py's checks, one table row each, and the JSON."""
    # before torch touches CUDA: NCCL's cuMem buffers off (as verl: they and the sleep mode disagree), and
    # expandable segments (less fragmentation between the phases' differently shaped allocations)
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sys.path.insert(0, str(ROOT / "bench"))
    import _gpu_inprocess as inprocess

    asked = list(inprocess.CHECKS) if args.checks == ",".join(CHECKS) else args.checks.split(",")
    if unknown := set(asked) - set(inprocess.CHECKS):
        print(f"unknown checks {sorted(unknown)}; choose from {tuple(inprocess.CHECKS)}", file=sys.stderr)
        return 2
    names = [n for n in inprocess.CHECKS if n in asked]  # the longest last
    start = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(results: dict) -> None:
        seconds = round(time.perf_counter() - start, 1)
        out.write_text(json.dumps({"host": "inprocess", "device": args.device, "seconds": seconds,
                                   "results": results}, indent=1, default=str))

    with tempfile.TemporaryDirectory(prefix="rlkit-gpu-check-") as tmp:
        results = inprocess.run_checks(names, args.device, max(1, args.steps), Path(tmp), write)
    print(f"wrote {out}")
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
