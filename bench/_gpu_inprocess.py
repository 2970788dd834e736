"""`bench/gpu_check.py --host inprocess`: the device checks on rlkit's worker code hosted in this process.

The roles are built as a Ray worker builds them (`rlkit.controller.worker_group.local_host`, the host `rlkit debug
replay` uses: rank 0 of a one-rank group, NCCL for CUDA tensors on a GPU, gloo on CPU), so no Ray and no vLLM are
needed: the lent GPU machine has neither. Checks, each a row of the table and an entry of the JSON:

- `env`: torch / CUDA / NCCL versions, device, bf16, which rlkit modules import and which optional packages exist;
- `numerics`: FSDPModel on the device in bf16 and fp32 against the plain transformers model in float32 on the CPU,
  on one fixed batch: response log-probs (packed rows), the fused chunked LM head, entropy, sum pi^2;
- `grpo_step`: steps of the real roles (actor + colocated hf rollout): generate, old log-probs, advantages (the
  driver's functions), update, weight sync; phase times, the update's MFU against the device's bf16 peak, the
  peak memory of each call (the host's own record), torch.compile off and on, then `param_offload` +
  `optimizer_offload` (device memory after the update, against the run without) and `empty_cache`;
- `weight_sync`: the tensors the sync streams (the actor's full parameters on the device, cast to the engine's
  dtype, in the layout the engine's names and shapes expect) against the same checkpoint read on the CPU, and the
  engine's weights after a sync against the trainer's.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {"bfloat16": (0.05, 0.5), "float32": (1e-4, 1e-3)}  # (mean, max) |diff| in nats (log-probs, entropy)
OPTIONAL = ("ray", "vllm", "hydra", "omegaconf", "debugpy")  # what the lent GPU machine lacks
RLKIT_MODULES = ("rlkit.workers.actor", "rlkit.workers.rollout_worker", "rlkit.rollout.hf_rollout",
                 "rlkit.controller.worker_group", "rlkit.trainer.step.advantage_stage", "rlkit.trainer.run.roles")
#: the random model's shape: Qwen2.5-0.5B's on a GPU (494M parameters with its 151936-token vocabulary), tiny on CPU
SHAPES = {
    "cuda": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "cpu": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2),
}
#: the GRPO workload per device: prompts x samples, prompt and response tokens
WORKLOAD = {"cuda": dict(prompts=32, n=8, prompt=256, response=512, micro=32),
            "cpu": dict(prompts=4, n=4, prompt=16, response=8, micro=16)}


# ------------------------------------------------------------------------------------------------ the model
def save_qwen_shaped(path: Path, device: str, seed: int = 0) -> Path:
    """A random Qwen2 model of the device's shape (nothing can be downloaded there) with rlkit's tiny tokenizer
    (token-in/token-out: ids beyond the tokenizer's words are fine), stored in bf16 as checkpoints are."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlkit.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    config = Qwen2Config(**SHAPES[device], max_position_embeddings=4096, tie_word_embeddings=True,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    with torch.device("cuda" if device == "cuda" else "cpu"):  # initialising 0.5B on the CPU takes a minute
        model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(path)
    tok.save_pretrained(path)
    del model
    return path


def join_group() -> None:
    """This process as rank 0 of a one-rank group, made as a worker makes it (`Worker.init_distributed`: NCCL for
    CUDA tensors and gloo for CPU ones on a GPU, gloo on CPU); the host's roles then find it joined."""
    import os

    from rlkit.controller.worker import Worker, reserve_master_port

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(reserve_master_port("127.0.0.1")))
    Worker().init_distributed()


# ------------------------------------------------------------------------------------------------ env
def check_env(device: str) -> dict:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0],
                            "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(cuda=torch.version.cuda, name=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),
                    nccl=".".join(map(str, torch.cuda.nccl.version())), bf16=torch.cuda.is_bf16_supported())
    failed = {}
    for mod in RLKIT_MODULES:
        try:
            importlib.import_module(mod)
        except Exception as exc:  # the row says which import broke
            failed[mod] = f"{type(exc).__name__}: {exc}"
    info["rlkit_imports_failed"] = failed
    info["optional_absent"] = [m for m in OPTIONAL if importlib.util.find_spec(m) is None]
    info["ray_or_vllm_imported"] = sorted(m for m in ("ray", "vllm") if m in sys.modules)
    import torch.distributed as dist

    info["process_group"] = str(dist.get_backend_config()) if dist.is_initialized() else None
    ok = not failed and not info["ray_or_vllm_imported"] and (device == "cpu" or torch.cuda.is_available())
    return {"ok": ok, **info}


# ------------------------------------------------------------------------------------------------ numerics
def fixed_batch(vocab: int, rows: int = 8, prompt: int = 24, response: int = 40):
    """Left-padded prompts + right-padded responses, as the trainer's batches are."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    for r in range(rows):
        mask[r, : r % 5] = 0
        mask[r, prompt + response - (r % 7):] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, response


def reference(model_path: Path, ids, mask, pos, response: int) -> dict:
    """Plain transformers, float32, CPU, padded rows: log-probs, entropy and sum pi^2 of the response tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -response - 1: -1].float()
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    return {"log_probs": logp.gather(-1, ids[:, -response:, None]).squeeze(-1), "entropy": -(p * logp).sum(-1),
            "sum_pi_squared": (p * p).sum(-1)}


def check_numerics(model_path: Path, device: str) -> dict:
    """FSDPModel's forward on the device in bf16 and fp32 (plain and fused head) against the CPU fp32 reference."""
    import torch

    from rlkit.config.schema import FSDPConfig
    from rlkit.workers.fsdp_model import FSDPModel

    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    ids, mask, pos, response = fixed_batch(SHAPES[device]["vocab_size"])
    ref = reference(model_path, ids, mask, pos, response)
    valid = mask[:, -response:].bool()
    rows: dict[str, Any] = {}
    ok = True
    for dtype in ("bfloat16", "float32"):  # FSDP2 (a one-rank group) even for one worker: the multi-GPU path
        model = FSDPModel(str(model_path), FSDPConfig(param_dtype=dtype, shard_single_worker=True), dev)
        mean_tol, max_tol = TOLERANCE[dtype]
        for fused in (False, True):
            with torch.no_grad():
                start = time.perf_counter()
                out = model.forward(ids, mask, pos, response, with_entropy=True, with_sum_pi_squared=True,
                                    fused_lm_head=fused, chunk_size=256)
                if device == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - start
            row: dict[str, Any] = {"forward_s": round(seconds, 4)}
            for key in ("log_probs", "entropy", "sum_pi_squared"):
                diff = (getattr(out, key).float().cpu() - ref[key]).abs()[valid]
                row[key] = [float(diff.mean()), float(diff.max())]
                ok = ok and row[key][0] < mean_tol and row[key][1] < max_tol
            rows[f"{dtype}{'/fused' if fused else ''}"] = row
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"ok": ok, "fsdp2": True, "tolerance": TOLERANCE, "tokens": int(valid.sum()), "diffs_mean_max": rows}


# ------------------------------------------------------------------------------------------------ the host
def run_config(model_path: Path, device: str, *, compile_layers: bool, offload: bool) -> Any:
    """The run config of the GRPO check (Hydra composition: hydra-core/omegaconf travel as wheels)."""
    from rlkit.trainer.run.run_config import load_config

    w = WORKLOAD[device]
    arr = "actor_rollout_ref"
    rows = w["prompts"] * w["n"]
    overrides = {
        "data.max_prompt_length": w["prompt"], "data.max_response_length": w["response"],
        "data.train_batch_size": w["prompts"], f"{arr}.model.path": model_path,
        f"{arr}.model.use_torch_compile": compile_layers, f"{arr}.model.use_remove_padding": True,
        f"{arr}.rollout.name": "hf", f"{arr}.rollout.n": w["n"], f"{arr}.rollout.max_num_seqs": rows,
        f"{arr}.rollout.log_prob_micro_batch_size_per_gpu": w["micro"],
        f"{arr}.actor.ppo_mini_batch_size": w["prompts"], f"{arr}.actor.ppo_micro_batch_size_per_gpu": w["micro"],
        f"{arr}.actor.use_kl_loss": False, f"{arr}.actor.fsdp_config.param_offload": offload,
        f"{arr}.actor.fsdp_config.optimizer_offload": offload, "algorithm.use_kl_in_reward": False,
        "trainer.device": device, "trainer.n_gpus_per_node": 1, "trainer.val_before_train": False,
        "trainer.logger": "[console]", "trainer.resume_mode": "disable",
    }
    return load_config("grpo", [f"{k}={v}" for k, v in overrides.items()])


def build_host(cfg: Any, model_path: Path) -> Any:
    """actor + colocated rollout in this process, as `rlkit debug replay` builds them (no Ray)."""
    from rlkit.controller.worker_group import ClassWithInitArgs, Sibling, local_host
    from rlkit.trainer.run.roles import actor_role
    from rlkit.workers.rollout_worker import RolloutWorker

    arr = cfg.actor_rollout_ref  # the colocated rollout role as rlkit.trainer.run.roles.rollout_role builds it
    rollout = ClassWithInitArgs(RolloutWorker, arr.rollout, str(model_path), actor=Sibling("actor"),
                                router_replay=arr.actor.router_replay)
    host = local_host({"actor": actor_role(cfg, str(model_path), total_steps=8), "rollout": rollout})
    host.call("actor", "init_model", None)
    host.call("rollout", "init_model", None)
    return host


def prompts(device: str, vocab: int):
    """The step's prompts, each repeated n times with a shared uid (GRPO's groups), left-padded."""
    import numpy as np
    import torch

    from rlkit.protocol import Batch

    w = WORKLOAD[device]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (w["prompts"], w["prompt"]), generator=g)
    mask = torch.ones_like(ids)
    for r in range(w["prompts"]):
        mask[r, : (r * 7) % (w["prompt"] // 2)] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                  {"uid": np.array([f"p{i}" for i in range(w["prompts"])], dtype=object)})
    return batch.repeat(w["n"], interleave=True)


def _timed(fn, device: str) -> tuple[Any, float]:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def grpo_step(host: Any, cfg: Any, batch: Any, device: str, step: int) -> tuple[dict[str, float], Any]:
    """One GRPO step through the roles' registered methods and the driver's advantage functions."""
    import torch

    from rlkit.reward.placement import on_last_token
    from rlkit.trainer.step.advantage_stage import compute_advantages, shape_rewards

    phases: dict[str, float] = {}
    out, phases["gen"] = _timed(lambda: host.call("rollout", "generate_sequences", step, batch, seed=step), device)
    # a made-up reward with spread inside every group: the fraction of even response tokens
    even = ((out["responses"] % 2 == 0) & out["response_mask"].bool()).sum(-1) / out["response_mask"].sum(-1).clamp(1)
    out["token_level_scores"] = on_last_token(even.float(), out["response_mask"])
    old, phases["old_log_prob"] = _timed(lambda: host.call("actor", "compute_log_prob", step, out), device)
    out = out.union(old.select(["old_log_probs"]))
    start = time.perf_counter()
    shape_rewards(out, cfg, None)
    compute_advantages(out, cfg)
    phases["adv"] = time.perf_counter() - start
    upd, phases["update_actor"] = _timed(lambda: host.call("actor", "update_actor", step, out), device)
    _, phases["update_weights"] = _timed(lambda: host.call("rollout", "sync_weights", step), device)
    metrics = {k: float(v[-1] if isinstance(v, list) else v) for k, v in upd.meta.get("metrics", {}).items()
               if k.startswith("actor/")}
    assert torch.isfinite(torch.tensor(metrics.get("actor/grad_norm", 0.0))), metrics
    return {**phases, **{f"metric:{k}": v for k, v in metrics.items()}}, out


def _update_mfu(cfg: Any, model_path: Path, out: Any, seconds: float, device: str) -> float | None:
    """The update's MFU against the device's dense bf16 peak (spec sheet; H200: 989 TFLOP/s); None on CPU."""
    import torch

    from rlkit.utils.flops import MFUMeter

    if device != "cuda":
        return None
    meter = MFUMeter.for_run(cfg, str(model_path), True, torch.bfloat16)
    return meter(meter.step_flops(out["attention_mask"], {"update_actor"}), seconds)


#: the step's runs: (name, use_torch_compile, param + optimizer offload). On CPU no compiled run (inductor takes
#: minutes there and the CPU mode is a CI test) and the offload run checks the config path (a no-op on CPU).
RUNS = {"cuda": (("eager", False, False), ("offload", False, True), ("compiled", True, False)),  # compile: last
        "cpu": (("eager", False, False), ("offload", False, True))}


def check_grpo_step(model_path: Path, device: str, steps: int) -> dict:
    """GRPO steps with torch.compile off and on, then with param + optimizer offload; times, MFU, memory."""
    import gc

    import torch

    from rlkit.config.schema import FSDPConfig  # noqa: F401  (config import before the roles: fail early)

    report: dict[str, Any] = {"workload": WORKLOAD[device], "runs": {}}
    ok = True
    after_update_gb: dict[str, float] = {}
    for name, compile_layers, offload in RUNS[device]:
        cfg = run_config(model_path, device, compile_layers=compile_layers, offload=offload)
        host = build_host(cfg, model_path)
        host.pop_memory_peaks()
        batch = prompts(device, SHAPES[device]["vocab_size"])
        rows = []
        for step in range(1, steps + 1):
            phases, out = grpo_step(host, cfg, batch, device, step)
            rows.append(phases)
        last = rows[-1]
        run: dict[str, Any] = {k: v if k.startswith("metric:") else round(v, 4) for k, v in last.items()}
        run["step_s"] = round(sum(last[p] for p in ("gen", "old_log_prob", "adv", "update_actor", "update_weights")),
                              3)
        run["mfu_update"] = _update_mfu(cfg, model_path, out, last["update_actor"], device)
        run["tokens"] = int(out["attention_mask"].sum())
        run["memory_peaks_gb"] = {m: {k: round(v, 3) for k, v in row.items()} for m, row in
                                  host.pop_memory_peaks().items()}
        if device == "cuda":
            after_update_gb[name] = torch.cuda.memory_allocated() / 2**30
            reserved = torch.cuda.memory_reserved()
            torch.cuda.empty_cache()
            run["empty_cache_freed_gb"] = round((reserved - torch.cuda.memory_reserved()) / 2**30, 3)
            run["allocated_after_step_gb"] = round(after_update_gb[name], 3)
        ok = ok and all(torch.isfinite(torch.tensor(v)) for k, v in last.items() if not k.startswith("metric:"))
        report["runs"][name] = run
        del host, out
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    if device == "cuda":  # offloaded parameters and optimizer state leave the device between phases
        freed = after_update_gb["eager"] - after_update_gb["offload"]
        report["offload_frees_gb"] = round(freed, 3)
        ok = ok and freed > 0
    return {"ok": ok, **report}


# ------------------------------------------------------------------------------------------------ weight sync
def check_weight_sync(model_path: Path, device: str) -> dict:
    """The sync's tensor path on the device against the CPU: names, shapes, dtype casts, values."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlkit.models.model_info import WeightNames
    from rlkit.rollout.base import engine_torch_dtype

    cfg = run_config(model_path, device, compile_layers=False, offload=False)
    host = build_host(cfg, model_path)
    actor, engine = host._roles["actor"], host._roles["rollout"].engine
    dtype = engine_torch_dtype(engine.dtype)
    cpu = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()  # tied head included
    stream = WeightNames.from_folder(model_path).stream(actor.model.iter_full_params())
    worst, count, devices, contiguous = 0.0, 0, set(), True
    for name, tensor in stream:
        devices.add(tensor.device.type)
        contiguous = contiguous and tensor.is_contiguous()
        got = tensor.to(dtype).cpu()
        worst = max(worst, float((got.float() - cpu[name].to(dtype).float()).abs().max()))
        count += 1
    finish = stream.finish()
    g = torch.Generator().manual_seed(7)  # new trainer weights (an update's stand-in), then the sync must carry them
    with torch.no_grad():
        for p in actor.model.module.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_((torch.randn(local.shape, generator=g) * 0.02).to(local.device, local.dtype))
    start = time.perf_counter()
    host.call("rollout", "sync_weights", None)
    sync_s = time.perf_counter() - start
    engine_state = engine.model.state_dict()
    trainer = dict(actor.model.iter_full_params())
    engine_gap = max(float((engine_state[k].float().cpu() - trainer[k].to(dtype).float().cpu()).abs().max())
                     for k in trainer if k in engine_state)
    moved = max(float((engine_state[k].float().cpu() - cpu[k].to(dtype).float()).abs().max()) for k in trainer)
    ok = worst == 0.0 and engine_gap == 0.0 and moved > 0 and count == len(trainer)
    return {"ok": bool(ok), "tensors": count, "max_abs_diff_vs_cpu": worst, "engine_vs_trainer": engine_gap,
            "engine_moved_from_checkpoint": moved,
            "devices": sorted(devices), "contiguous": contiguous, "engine_dtype": str(dtype),
            "sync_s": round(sync_s, 3),
            "stream": finish}


def _summary(name: str, r: dict) -> str:
    """The table's key numbers of one check (the JSON has them all)."""
    if "error" in r:
        return r["error"].strip().splitlines()[-1][:100]
    if name == "env":
        return (f"torch {r['torch']} cuda {r.get('cuda')} nccl {r.get('nccl')} {r.get('name', 'cpu')} "
                f"group {r['process_group']} absent {','.join(r['optional_absent']) or '-'}")
    if name == "numerics":
        return " ".join(f"{k}: logp {v['log_probs'][0]:.1e}/{v['log_probs'][1]:.1e}" for k, v in
                        r["diffs_mean_max"].items())
    if name == "grpo_step":
        runs = " | ".join(f"{k} step {v['step_s']:.2f}s gen {v['gen']:.2f} upd {v['update_actor']:.2f}"
                          + (f" mfu {v['mfu_update']:.1%}" if v["mfu_update"] is not None else "")
                          for k, v in r["runs"].items())
        return runs + (f" | offload frees {r['offload_frees_gb']:.2f} GB" if "offload_frees_gb" in r else "")
    return (f"{r['tensors']} tensors, vs cpu {r['max_abs_diff_vs_cpu']:.1e}, engine vs trainer "
            f"{r['engine_vs_trainer']:.1e}, sync {r['sync_s']:.3f}s")


def table(results: dict[str, dict]) -> str:
    """One row per check: name, verdict, seconds, key numbers."""
    lines = [f"{'check':12s} {'ok':6s} {'s':>7s}  numbers", "-" * 100]
    for name, r in results.items():
        lines.append(f"{name:12s} {'ok' if r['ok'] else 'FAILED':6s} {r['seconds']:7.1f}  {_summary(name, r)}")
    return "\n".join(lines)


#: in the order they run: the longest (grpo_step) last, so a run stopped at its time limit keeps the others' rows
CHECKS = {"env": lambda m, d, s: check_env(d), "numerics": lambda m, d, s: check_numerics(m, d),
          "weight_sync": lambda m, d, s: check_weight_sync(m, d), "grpo_step": lambda m, d, s: check_grpo_step(m, d, s)}


def run_checks(names: list[str], device: str, steps: int, tmp: Path,
               write: Callable[[dict[str, dict]], None] = lambda results: None) -> dict[str, dict]:
    """Every check in this process, one row each; a failed check is a result, the others still run. `write` gets
    the results so far after each check (the JSON is on disk even if the run is stopped at its time limit)."""
    import traceback

    join_group()
    model = save_qwen_shaped(tmp / "model", device)
    results: dict[str, dict] = {}
    for name in names:
        start = time.perf_counter()
        try:
            results[name] = CHECKS[name](model, device, steps)
        except Exception:
            results[name] = {"ok": False, "error": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{name:12s} {'ok' if results[name]['ok'] else 'FAILED':6s} "
              f"{json.dumps({k: v for k, v in results[name].items() if k != 'ok'}, default=str)[:800]}", flush=True)
        write(results)
    print(table(results), flush=True)
    return results
