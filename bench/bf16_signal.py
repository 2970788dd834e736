"""Where bf16 compute loses the learning signal: each suspect of a bf16 actor measured on the real model.

    .venv/bin/python bench/bf16_signal.py                # -> bench/results/bf16_signal.json
    .venv/bin/python bench/bf16_signal.py --steps 8 --lr 1e-5 --rows 8

One process, no Ray: SmolLM2-135M-Instruct (`rlkit model pull smollm2-135m-instruct`) as `FSDPModel`
in float32 and in bf16 compute (FSDP2 mixed precision, as the trainer builds it), the same batch for both:
GSM8K train questions in the chat template, their reference solutions as responses, a fixed +-1 advantage
per row (GRPO's signed signal). Each model takes `--steps` AdamW steps on the policy-gradient surrogate
`-mean(A * log p)` at the quickstart's learning rate, and after each step this measures, on the same batch:

* the surrogate gain `mean(A * (log p_k - log p_0))` in the model's own compute view (what the learning
  signal did to the policy the trainer scores and the engine samples), and the same for the bf16 model's
  fp32 master weights evaluated in float32 (what the optimizer did);
* the fraction of weights whose master moved and whose bf16 view (what the forward computes with) moved;
* the dtypes of the master weights, the gradients and Adam's state (fp32 master weights kept?);
* the log-prob head: |log p| with the LM head and log-softmax in bf16 vs in fp32 on the same bf16 hidden states.

`--dither` repeats the bf16 model with rlkit's fix (`fsdp_config.dither_master_weights`, rlkit/workers/master_dither.py)
on; the plain bf16 row has it off.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_OUT = ROOT / "bench" / "results" / "bf16_signal.json"


def gsm8k_batch(tokenizer, rows: int, max_response: int) -> dict[str, torch.Tensor]:
    """Left-padded chat prompts + right-padded reference solutions, as the rollout hands them to the actor."""
    lines = (Path(ROOT).parent / "shared" / "data" / "gsm8k" / "train.jsonl").read_text().splitlines()[:rows]
    prompts, responses = [], []
    for line in lines:
        row = json.loads(line)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["question"]}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        responses.append(tokenizer(row["answer"], add_special_tokens=False)["input_ids"][:max_response])
    p_len, r_len = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id or 0
    ids = torch.full((rows, p_len + r_len), pad)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, p_len - len(p) : p_len] = torch.tensor(p)
        ids[i, p_len : p_len + len(r)] = torch.tensor(r)
        mask[i, p_len - len(p) : p_len + len(r)] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    resp_mask = mask[:, p_len:].float()
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(rows)]).unsqueeze(1)
    return {"ids": ids, "mask": mask, "pos": pos, "resp_mask": resp_mask, "adv": adv, "r_len": r_len}


def surrogate(log_probs: torch.Tensor, batch: dict) -> torch.Tensor:
    m = batch["resp_mask"]
    return (batch["adv"] * log_probs * m).sum() / m.sum()


def views(model) -> dict[str, torch.Tensor]:
    """Each master weight (fp32, as the optimizer holds it) by name."""
    out = {}
    for name, p in model.module.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        out[name] = local.detach().clone()
    return out


def moved(before: dict, after: dict, to_bf16: bool) -> float:
    changed = total = 0
    for name, a in after.items():
        b = before[name]
        if to_bf16:
            a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
        changed += int((a != b).sum())
        total += a.numel()
    return changed / total


def train(model_dir: str, dtype: str, batch: dict, steps: int, lr: float, dither: bool) -> dict:
    from rlkit.config.schema import FSDPConfig, OptimConfig
    from rlkit.workers.fsdp_model import FSDPModel

    fsdp = FSDPConfig(param_dtype=dtype, dither_master_weights=dither)
    model = FSDPModel(model_dir, fsdp, torch.device("cpu"))
    model.setup_optimizer(OptimConfig(lr=lr, lr_warmup_steps=0), total_steps=steps)
    args = (batch["ids"], batch["mask"], batch["pos"], batch["r_len"])
    masters0 = views(model)
    with torch.no_grad():
        lp0 = model.forward(*args).log_probs
    record: dict = {"dtype": dtype, "dither": dither, "steps": []}
    start = time.perf_counter()
    for step in range(1, steps + 1):
        loss = -surrogate(model.forward(*args).log_probs, batch)
        loss.backward()
        if step == 1:
            grads = {p.grad.dtype for p in model.trainable_parameters() if p.grad is not None}
            record["grad_dtypes"] = sorted(str(g) for g in grads)
        norm = model.clip_and_step(1.0)
        masters = views(model)  # before the next forward: FSDP2 leaves the root unit unsharded (bf16) after one
        with torch.no_grad():
            lp = model.forward(*args).log_probs
        row = {
            "step": step,
            "grad_norm": norm,
            "gain_view": float(surrogate(lp - lp0, batch)),
            "masters_moved": moved(masters0, masters, to_bf16=False),
            "bf16_view_moved": moved(masters0, masters, to_bf16=True),
        }
        record["steps"].append(row)
        print(f"  {dtype}{' +dither' if dither else ''} step {step}: {row}", flush=True)
    record["seconds"] = time.perf_counter() - start
    record["master_dtypes"] = sorted({str(t.dtype) for t in masters.values()})
    state = model.optimizer.state.values()
    record["adam_state_dtypes"] = sorted({str(v.dtype) for s in state for v in s.values() if v.dim() > 0})
    record["final_masters"] = masters
    return record


def master_gain_fp32(model_dir: str, masters: dict, batch: dict) -> float:
    """The bf16 run's fp32 master weights evaluated in float32: the gain the optimizer made."""
    from rlkit.config.schema import FSDPConfig
    from rlkit.workers.fsdp_model import FSDPModel

    model = FSDPModel(model_dir, FSDPConfig(param_dtype="float32"), torch.device("cpu"))
    args = (batch["ids"], batch["mask"], batch["pos"], batch["r_len"])
    with torch.no_grad():
        lp0 = model.forward(*args).log_probs
        model.module.load_state_dict(masters, strict=False)
        lp = model.forward(*args).log_probs
    return float(surrogate(lp - lp0, batch))


def head_precision(model_dir: str, batch: dict) -> dict:
    """|log p(bf16 head) - log p(fp32 head)| on the same bf16 hidden states (the log-prob head suspect)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        hidden = model.model(input_ids=batch["ids"], attention_mask=batch["mask"]).last_hidden_state
        hidden = hidden[:, -batch["r_len"] - 1 : -1]
        labels = batch["ids"][:, -batch["r_len"] :]
        w = model.get_output_embeddings().weight
        lp_bf16 = torch.log_softmax((hidden @ w.T).float(), -1).gather(-1, labels[..., None])[..., 0]
        lp_fp32 = torch.log_softmax(hidden.float() @ w.float().T, -1).gather(-1, labels[..., None])[..., 0]
    m = batch["resp_mask"].bool()
    diff = (lp_bf16 - lp_fp32).abs()[m]
    return {"mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()), "tokens": int(m.sum())}


def main(argv: list[str] | None = None) -> dict:
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from rlkit.models.resolve import resolve_model_path
    from rlkit.utils.cpu_precision import read_isa

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--max-response", type=int, default=96)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--dither", action="store_true", help="also run bf16 with the master-weight dither")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    model_dir = str(resolve_model_path(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = gsm8k_batch(tokenizer, args.rows, args.max_response)
    print(f"bf16_signal: {read_isa().describe()}, load {os.getloadavg()[0]:.2f}", flush=True)
    result: dict = {"isa": read_isa().describe(), "load_avg_1m": [os.getloadavg()[0]], "lr": args.lr,
                    "rows": args.rows, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "s"), 1), rank=0, world_size=1)
        runs = [("float32", False), ("bfloat16", False)] + ([("bfloat16", True)] if args.dither else [])
        for dtype, dither in runs:
            rec = train(model_dir, dtype, batch, args.steps, args.lr, dither)
            masters = rec.pop("final_masters")
            if dtype == "bfloat16":
                rec["gain_masters_fp32"] = master_gain_fp32(model_dir, masters, batch)
            result[f"{dtype}{'_dither' if dither else ''}"] = rec
        result["head"] = head_precision(model_dir, batch)
        dist.destroy_process_group()
    result["load_avg_1m"].append(os.getloadavg()[0])
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))
    for key in ("float32", "bfloat16", "bfloat16_dither"):
        if key in result:
            last = result[key]["steps"][-1]
            print(f"{key:>16}: gain(view) {last['gain_view']:+.4f}  masters moved {last['masters_moved']:.3f}  "
                  f"bf16 view moved {last['bf16_view_moved']:.3f}  gain(fp32 masters) "
                  f"{result[key].get('gain_masters_fp32', float('nan')):+.4f}")
    print(f"head: {result['head']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
