"""TRL side of `bench/dpo_vs_trl.py`: DPOTrainer on the benchmark's pairs, run with bench/.venv-trl's python.

    bench/.venv-trl/bin/python bench/_trl_dpo_worker.py --model DIR --data FILE --out FILE.json [--bf16] [--precompute]

The pairs are conversational (prompt: the user turn; chosen/rejected: an assistant turn), so TRL applies the chat
template as rlkit does. The reference is TRL's default: a frozen copy of the model, or (`--precompute`,
`precompute_ref_log_probs=True`) its log-probs of every pair computed before the first step. Step time comes from a
TrainerCallback (on_step_begin -> on_step_end: one optimizer step, the reference forward included when it runs per
step); `before_first_step_s` is train() up to the first step (the precompute, when on). Config keys this TRL version
does not know are dropped and listed. Writes {"steps": [{step, step_s}], "peak_rss_mb", "before_first_step_s", ...}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--max-prompt-length", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--bf16", action="store_true", help="bf16=True: fp32 weights, bf16 autocast")
    ap.add_argument("--precompute", action="store_true", help="precompute_ref_log_probs=True")
    args = ap.parse_args()

    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    rows = [{k: list(r[k]) for k in ("prompt", "chosen", "rejected")} for r in
            pd.read_parquet(args.data).to_dict("records")]
    wanted = dict(
        output_dir=str(Path(args.out).with_suffix("")) + "-trl-out", per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1, max_length=args.max_length, max_prompt_length=args.max_prompt_length,
        truncation_mode="keep_end", learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        max_steps=args.steps, use_cpu=True, bf16=args.bf16, fp16=False, model_init_kwargs={"dtype": torch.float32},
        gradient_checkpointing=False, beta=args.beta, loss_type="sigmoid", precompute_ref_log_probs=args.precompute,
        precompute_ref_batch_size=args.batch, logging_steps=1, save_strategy="no", report_to=[], seed=1,
        dataloader_num_workers=0, train_sampling_strategy="sequential",  # rlkit's data.shuffle=false: same batches
    )
    known = {f.name for f in dataclasses.fields(DPOConfig)}
    config = DPOConfig(**{k: v for k, v in wanted.items() if k in known})
    trainer = DPOTrainer(model=args.model, args=config, train_dataset=Dataset.from_list(rows))
    steps: list[dict] = []
    marks: dict[str, float] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            marks.setdefault("first_step", time.perf_counter())
            self.start = time.perf_counter()

        def on_step_end(self, args_, state, control, **kw):
            steps.append({"step": state.global_step, "step_s": time.perf_counter() - self.start})

    trainer.add_callback(StepTimer())
    began = time.perf_counter()
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(args.out).write_text(json.dumps({
        "framework": "trl", "steps": steps, "peak_rss_mb": peak, "precompute": args.precompute,
        "before_first_step_s": marks.get("first_step", began) - began,
        "dropped_keys": sorted(set(wanted) - known)}))


if __name__ == "__main__":
    main()
