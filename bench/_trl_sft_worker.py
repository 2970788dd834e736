"""TRL side of `bench/sft_vs_trl.py`: SFTTrainer on the benchmark workload, run with bench/.venv-trl's python.

    bench/.venv-trl/bin/python bench/_trl_sft_worker.py --model DIR --data FILE --out FILE.json [--bf16]

Rows are prompt-completion conversations (the user turn, the assistant turn), so the loss covers the completion
only, as rlkit's assistant-only mask does. Step time and tokens come from a TrainerCallback: on_step_begin ->
on_step_end is one optimizer step; tokens are the non-padding input tokens TRL counts (`num_input_tokens_seen`).
Rows are taken in file order (`train_sampling_strategy="sequential"`, as rlkit's `data.shuffle=false`), so each
step's batch is the same 8 conversations on both sides. Writes {"steps": [{step, step_s, tokens}], "peak_rss_mb": ...}.
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--bf16", action="store_true", help="bf16=True: fp32 weights, bf16 autocast")
    args = ap.parse_args()

    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rows = []
    for r in pd.read_parquet(args.data).to_dict("records"):
        turns = [dict(m) for m in r["messages"]]
        rows.append({"prompt": [t for t in turns if t["role"] != "assistant"],
                     "completion": [t for t in turns if t["role"] == "assistant"]})
    config = SFTConfig(
        output_dir=str(Path(args.out).with_suffix("")) + "-trl-out", per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1, max_length=args.max_length, learning_rate=1e-5, lr_scheduler_type="constant",
        warmup_steps=0, max_steps=args.steps, use_cpu=True, bf16=args.bf16, fp16=False,
        model_init_kwargs={"dtype": torch.float32}, gradient_checkpointing=False, packing=False,
        logging_steps=1, save_strategy="no", report_to=[], seed=1, dataloader_num_workers=0,
        include_num_input_tokens_seen="non_padding",
        train_sampling_strategy="sequential",  # the rows in file order, as rlkit's data.shuffle=false: same batches
    )
    trainer = SFTTrainer(model=args.model, args=config, train_dataset=Dataset.from_list(rows))
    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            self.start, self.tokens = time.perf_counter(), state.num_input_tokens_seen

        def on_step_end(self, args_, state, control, **kw):
            steps.append({"step": state.global_step, "step_s": time.perf_counter() - self.start,
                          "tokens": float(state.num_input_tokens_seen - self.tokens)})

    trainer.add_callback(StepTimer())
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(args.out).write_text(json.dumps({"framework": "trl", "steps": steps, "peak_rss_mb": peak}))


if __name__ == "__main__":
    main()
