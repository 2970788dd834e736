"""`--debug nan` on a run whose gradient turns NaN on one rank: a real `rlkit train` subprocess on the toy task (on its
own local Ray), as a user runs it. (`rlkit debug stacks` is checked on the paused runs of test_train_debug.py and
test_cluster_flow.py.)

- `--debug nan` with a plugin loss (tests/debug/nan_plugin.py) whose gradient is NaN at step 3 on rank 1 of 2: the
  run stops at step 3 with one line naming the gradient's parameter and rank 1, the micro-batch file and the
  replay command, and logs no step after 2.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.debug._runs import Run
from tests.debug.nan_case import LOSS, RANK, STEP

pytestmark = pytest.mark.slow


def test_debug_nan_stops_at_the_first_nan_gradient_naming_parameter_and_rank(toy):
    args = [*toy.args("ckpt_nan", steps=5), "trainer.n_gpus_per_node=2", "trainer.val_before_train=false",
            "trainer.plugins=[tests.debug.nan_plugin]", f"actor_rollout_ref.actor.policy_loss={LOSS}"]
    run = Run.start(toy, ["grpo", "--debug", "nan", *args])
    try:
        assert run.wait(300) == 1, run.output[-4000:]
    finally:
        run.stop()
    last = run.output.strip().splitlines()[-1]
    assert last.startswith("non-finite gradient actor of model.") and f"at step {STEP}, rank {RANK};" in last, last
    saved = toy.root / "ckpt_nan" / "logs" / "anomalies" / f"step{STEP}_rank{RANK}_gradient.pt"
    assert f"saved to {saved}" in last and saved.is_file()
    assert last.endswith(f"replay the step with: rlkit debug replay {toy.root / 'ckpt_nan'} --step {STEP}")
    rows = torch.load(saved, weights_only=False)  # the micro-batch, with its sample ids
    assert len(rows) > 0 and "uid" in rows.non_tensors and "responses" in rows.tensors
    assert "Traceback" not in run.output
    steps = [json.loads(line)["step"] for line in (toy.root / "ckpt_nan" / "logs" / "metrics.jsonl").open()]
    assert steps == list(range(1, STEP))  # the steps before the NaN, none after
