"""CURE-style co-evolution of a coder and a unit tester (one policy, both roles in each batch).

The trainer is the stock GRPO loop; only the reward differs: `rlkit.reward.coevolve.CoevolveReward`
replaces the per-sample reward manager and sees the whole batch, so it can run every program
against every generated test of the same problem (the k x m pass matrix) before scoring either role.

    python recipes/coevolve_code.py --config recipes/coevolve_code.yaml [key=value ...]

Data: `rlkit data code --coevolve` (a coder row and a tester row per problem, side by side). Keep
`data.shuffle=false` and an even `data.train_batch_size` so both rows of a problem share a batch;
a problem whose other role is missing still gets scored (coders on the reference tests, testers on
the reference solution), see docs/agents.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

log = logging.getLogger("coevolve")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", default=None, help="YAML merged over the algorithm preset")
    p.add_argument("--algo", default="grpo", help="algorithm preset (default grpo)")
    p.add_argument("--tester-reward", default="gated", help="tester reward: gated | balanced")
    p.add_argument("--tests-per-run", type=int, default=1, help="generated tests sharing one tester process")
    p.add_argument("--per-test-s", type=float, default=2.0, help="time limit of each test in the sandbox")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from rlkit.errors import UserError
    from rlkit.reward.coevolve import CoevolveReward, MatrixLimits
    from rlkit.trainer.config import load_config
    from rlkit.trainer.launch import LaunchOptions, init_ray, resource_plan, summary_table
    from rlkit.trainer.ppo_trainer import RLTrainer
    from rlkit.utils.tracking import Tracking

    args = parse_args(argv)
    console = Console()
    cfg = load_config(args.algo, args.overrides, args.config)
    if cfg.data.shuffle or cfg.data.train_batch_size % 2:
        raise UserError("coevolve: set data.shuffle=false and an even data.train_batch_size so the coder and "
                        "tester rows of a problem land in the same batch")
    console.print(resource_plan(cfg))
    import ray

    owns_ray = not ray.is_initialized()
    if owns_ray:
        init_ray(cfg, LaunchOptions(), console)
    started = time.perf_counter()
    trainer = None
    log_dir = cfg.trainer.log_dir or os.path.join(os.path.expanduser(cfg.trainer.default_local_dir), "logs")
    try:
        trainer = RLTrainer(cfg)
        limits = MatrixLimits(per_test_s=args.per_test_s, tests_per_run=args.tests_per_run,
                              max_workers=cfg.reward_model.num_workers)
        # the batch-level hook: every rollout (and validation) batch is scored here
        trainer.reward_fn = CoevolveReward(trainer.tokenizer, limits, args.tester_reward, fallback=trainer.reward_fn)
        with Tracking(cfg.trainer.logger, cfg.trainer.project_name, cfg.trainer.experiment_name, log_dir,
                      trainer.total_steps, cfg) as tracker:
            trainer.tracker = tracker
            summary = trainer.fit()
        summary.log_dir = log_dir
        summary.wall_s = time.perf_counter() - started
        console.print(summary_table(summary))
    finally:
        if trainer is not None:
            trainer.workers.shutdown()
        if owns_ray:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
