"""The batch-key contract (rlkit/batch_keys.py) and `--debug`'s check of every worker call's output against it."""

from __future__ import annotations

import pytest
import torch

from rlkit.batch_keys import BATCH_KEYS, CALL_OUTPUTS, check_output
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.run.workers_setup import WorkerHandles
from rlkit.trainer.step.key_checks import CheckedView, check_batch_keys


def _rollout_out(rows: int = 4, prompt: int = 5, response: int = 3) -> Batch:
    ids = torch.ones((rows, prompt + response), dtype=torch.long)
    return Batch({"prompts": ids[:, :prompt], "responses": ids[:, prompt:], "response_mask": ids[:, prompt:],
                  "input_ids": ids, "attention_mask": ids, "position_ids": ids})


def test_every_required_output_is_declared():
    assert {k for keys in CALL_OUTPUTS.values() for k in keys} <= set(BATCH_KEYS)


def test_a_conforming_output_passes():
    check_output("rollout", "generate_sequences", _rollout_out(), rows=4, response_length=None)
    check_output("actor", "compute_log_prob", Batch({"old_log_probs": torch.zeros(4, 3)}), 4, 3)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (Batch({"entropys": torch.zeros(4, 3)}), "actor.compute_log_prob returned no ['old_log_probs']"),
        (Batch({"old_log_probs": torch.zeros(4, 2)}), "'old_log_probs' with shape (4, 2): R is 2, expected 3"),
        (Batch({"old_log_probs": torch.zeros(4, 3, dtype=torch.bfloat16)}), "'old_log_probs' as torch.bfloat16"),
        (Batch({"old_log_probs": torch.zeros(12)}), "'old_log_probs' with shape (12,), declared (B, R)"),
    ],
)
def test_a_wrong_output_names_the_role_call_and_key(out, message):
    with pytest.raises(UserError, match="batch keys: actor.compute_log_prob") as err:
        check_output("actor", "compute_log_prob", out, rows=4 if len(out) != 12 else 12, response_length=3)
    assert message in str(err.value)


class _ActorView:
    """Stands in for a role's WorkerGroupView: its methods return what a worker would."""

    def __init__(self, lp: torch.Tensor) -> None:
        self.lp, self.world_size = lp, 1

    def compute_log_prob(self, batch: Batch) -> Batch:
        return Batch({"old_log_probs": self.lp})


def test_the_checked_view_checks_declared_calls_and_forwards_the_rest():
    batch = _rollout_out()
    handles = WorkerHandles([], {"actor": _ActorView(torch.zeros(4, 3))}, 1)
    check_batch_keys(handles)
    assert isinstance(handles.actor, CheckedView) and handles.actor.world_size == 1
    assert "old_log_probs" in handles.actor.compute_log_prob(batch)
    check_batch_keys(handles)  # idempotent: no double wrap
    assert isinstance(handles.actor._view, _ActorView)
    handles.actor._view.lp = torch.zeros(4, 7)
    with pytest.raises(UserError, match="R is 7, expected 3"):
        handles.actor.compute_log_prob(batch)
