"""TRL side of `bench/vs_trl.py`: GRPOTrainer on the benchmark workload, in bench/.venv-trl.

    bench/.venv-trl/bin/python bench/_trl_worker.py --model DIR --data FILE --out FILE.json [--beta 0.04]

The reward is rlkit's own gsm8k scorer, imported from this checkout (the repo is put on
sys.path; the scorer needs only the standard library, numpy and torch). Step time comes from
a TrainerCallback (on_step_begin -> on_step_end = one optimizer step = one generation batch);
generation and reward time from wrapping GRPOTrainer's `_generate_single_turn` and
`_calculate_rewards`. Writes {"steps": [...], "peak_rss_mb": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def gsm8k_reward(completions, reward_model, **_):
    """rlkit's scorer (default kwargs, as rlkit's RewardManager calls it) on each completion's text."""
    from rlkit.reward.gsm8k import gsm8k_score

    out = []
    for completion, rm in zip(completions, reward_model):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        out.append(float(gsm8k_score(text, rm["ground_truth"])["score"]))
    return out


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--micro", type=int, default=4, help="per_device_train_batch_size (grad accumulation fills 16)")
    ap.add_argument("--bf16", action="store_true",
                    help="TRL's bf16=True: fp32 weights, bf16 autocast (its best precision where bf16 has kernels)")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="TRL's default; off here by default because it also turns off the KV cache in generate")
    args = ap.parse_args()

    import pandas as pd
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = pd.read_parquet(args.data).to_dict("records")
    for r in rows:  # parquet gives numpy arrays; TRL wants plain lists of messages
        r["prompt"] = [dict(m) for m in r["prompt"]]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "reward_model": dict(r["reward_model"])} for r in rows])

    sequences = 16  # 4 prompts x 4 samples
    config = GRPOConfig(
        output_dir=str(Path(args.out).with_suffix("")) + "-trl-out",
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=sequences // args.micro,
        num_generations=4,
        max_completion_length=128,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=args.beta,
        max_steps=args.steps,
        use_cpu=True,
        bf16=args.bf16,  # on CPU: torch.autocast(cpu, bfloat16) around the forward, fp32 master weights
        fp16=False,
        model_init_kwargs={"dtype": torch.float32},
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_vllm=False,
        # TRL >= 1.0 defaults to True; in train mode transformers then drops the KV cache inside `generate`
        # (every new token recomputes the whole sequence), and rlkit does not checkpoint either
        gradient_checkpointing=args.gradient_checkpointing,
        seed=1,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=gsm8k_reward, args=config, train_dataset=dataset)

    phases = {"gen": 0.0, "reward": 0.0}

    def timed(name, fn):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] += time.perf_counter() - start
        return wrapper

    trainer._generate_single_turn = timed("gen", trainer._generate_single_turn)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)

    steps: list[dict] = []
    logged: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            phases.update(gen=0.0, reward=0.0)
            self.start, self.cpu = time.perf_counter(), cpu_seconds()

        def on_step_end(self, args_, state, control, **kw):
            step_s = time.perf_counter() - self.start
            row = {"step": state.global_step, "step_s": step_s, "gen_s": phases["gen"], "reward_s": phases["reward"],
                   "cpu_s": cpu_seconds() - self.cpu, "load_avg_1m": os.getloadavg()[0]}
            steps.append(row)
            print(f"[trl] step {row['step']}: step={step_s:.2f}s gen={row['gen_s']:.2f}s "
                  f"reward={row['reward_s']:.2f}s", flush=True)

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs:
                logged.append({**{k: v for k, v in logs.items() if isinstance(v, (int, float))},
                               "step": state.global_step})

    trainer.add_callback(StepTimer())
    start = time.perf_counter()
    trainer.train()
    # merge TRL's logged metrics (completion lengths, reward) into the step rows
    by_step = {r["step"]: r for r in logged if "reward" in r}  # not the end-of-training summary row
    for row in steps:
        log = by_step.get(row["step"], {})
        row["response_length_mean"] = log.get("completions/mean_length")
        row["reward_mean"] = log.get("reward")
    result = {
        "framework": "trl",
        "trl_version": __import__("trl").__version__,
        "beta": args.beta,
        "micro": args.micro,
        "gradient_checkpointing": args.gradient_checkpointing,
        "train_s": time.perf_counter() - start,
        "steps": steps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": torch.get_num_threads(),
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"[trl] wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
