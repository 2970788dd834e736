"""What a classifier reward model costs per GRPO step: the same workload without and with `reward_model.enable`.

    .venv/bin/python bench/rm_overhead.py                      # tiny policy + tiny RM, toy prompts
    .venv/bin/python bench/rm_overhead.py --model smollm2-135m-instruct --rm from-policy \\
        --prompts 4 --n 4 --response-length 64 --steps 4      # SmolLM2-135M + a 135M RM (its weights, fresh head)

`--rm`: `tiny` (a random tiny LlamaForSequenceClassification), `from-policy` (the policy's own weights under
a fresh one-label score head: a 135M-class RM for SmolLM2; its scores mean nothing, its cost is real) or any
HF folder / alias. The workload and the loop are bench/grpo_step.py's (`--set` passes more overrides to both
runs). Reported per run, median of steps 2..N: step time, the driver's reward phase (rule scorers + the RM
call), the RM forward inside the worker (`timing_s/compute_rm_score`) and the worker process's RSS while
the engine is awake (`perf/rollout_rss_mb_awake`; colocated, so the RM's weights are in it). JSON in
bench/results/rm_overhead[_<tag>].json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import Recorder, overrides, parse_args, tiny_model, toy_parquet  # noqa: E402

KEYS = (
    "timing_s/step",
    "timing_s/reward",
    "timing_s/compute_rm_score",
    "perf/rollout_rss_mb_awake",
    "perf/reward_model_rss_mb",
    "reward/rm/mean",
)


def build_rm(kind: str, policy: str, out: Path) -> str:
    """The RM folder for `--rm`."""
    from rlkit.models.resolve import resolve_model_path

    if kind == "tiny":
        from rlkit.testing import save_tiny_reward_model

        return str(save_tiny_reward_model(out / "tiny_rm"))
    if kind != "from-policy":
        return str(resolve_model_path(kind))
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    src = resolve_model_path(policy)
    tok = AutoTokenizer.from_pretrained(src)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(src, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    model.save_pretrained(out / "rm_from_policy")
    tok.save_pretrained(out / "rm_from_policy")
    return str(out / "rm_from_policy")


def one_run(args: argparse.Namespace, model: str, data: Path, scratch: Path, extra: list[str]) -> dict:
    import ray

    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.step.rl_trainer import RLTrainer

    cfg = load_config("grpo", overrides(args, model, data, scratch) + extra)
    ray.init(
        address="local",
        num_cpus=max(1, int(args.workers * args.cpus_per_worker)),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    rec = Recorder()
    trainer = RLTrainer(cfg, tracker=rec)
    try:
        for step in range(1, args.steps + 1):
            trainer.global_step = step
            start = time.perf_counter()
            result = trainer.train_step()
            rec.log(result.log_row(time.perf_counter() - start, trainer.mfu_meter), step)
            print(f"step {step}/{args.steps}: {time.perf_counter() - start:.2f}s", file=sys.stderr, flush=True)
    finally:
        trainer.workers.shutdown()
        ray.shutdown()
    timed = rec.rows[1:] or rec.rows
    return {k: statistics.median(r[k] for r in timed) if all(k in r for r in timed) else None for k in KEYS}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    rm_kind, tag = "tiny", ""
    for flag in ("--rm", "--tag"):
        if flag in argv:
            i = argv.index(flag)
            value = argv[i + 1]
            del argv[i : i + 2]
            rm_kind, tag = (value, tag) if flag == "--rm" else (rm_kind, value)
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlkit-rm-bench-") as tmp:
        scratch = Path(tmp)
        model = args.model or str(tiny_model(scratch))
        data = Path(args.data) if args.data else toy_parquet(scratch / "toy", args.digits)
        rm = build_rm(rm_kind, model, scratch)
        runs = {
            "no_rm": one_run(args, model, data, scratch, []),
            "rm": one_run(
                args,
                model,
                data,
                scratch,
                [
                    "reward_model.enable=true",
                    f"reward_model.model.path={rm}",
                    f"reward_model.micro_batch_size_per_gpu={args.micro_batch}",
                ],
            ),
        }
    base, with_rm = runs["no_rm"], runs["rm"]
    overhead = {
        "step_s": with_rm["timing_s/step"] - base["timing_s/step"],
        "reward_phase_s": with_rm["timing_s/reward"] - base["timing_s/reward"],
        "rss_mb": (with_rm["perf/rollout_rss_mb_awake"] or 0) - (base["perf/rollout_rss_mb_awake"] or 0),
    }
    report = {
        "workload": {
            "model": model,
            "rm": rm_kind,
            "prompts": args.prompts,
            "n": args.n,
            "response_length": args.response_length,
            "steps": args.steps,
            "set": args.set,
        },
        "runs": runs,
        "rm_overhead": overhead,
    }
    print(f"{'':28s}{'no RM':>12s}{'RM':>12s}")
    for key in KEYS:
        a, b = base[key], with_rm[key]
        print(f"{key:28s}{'-' if a is None else f'{a:.3f}':>12s}{'-' if b is None else f'{b:.3f}':>12s}")
    print(
        f"RM overhead per step: {overhead['step_s']:+.3f}s (reward phase {overhead['reward_phase_s']:+.3f}s), "
        f"worker RSS {overhead['rss_mb']:+.0f} MB"
    )
    out = Path("bench/results") / f"rm_overhead{'_' + tag if tag else ''}.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
