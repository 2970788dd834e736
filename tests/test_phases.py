"""rlkit/phases.py is the one declaration of the step's phases: every phase name the code spells is declared there,
and every reader's view (batch-key contract, breakpoints, FLOP meter, rlkit top, replay) comes from it."""

from __future__ import annotations

import re
from pathlib import Path

from rlkit.batch_keys import BATCH_KEYS, CALL_OUTPUTS
from rlkit.phases import PHASES, break_names, call_roles, role_call, training_calls

ROOT = Path(__file__).resolve().parents[1] / "rlkit"
# the ways code enters a phase by name: the step's timer, the status file, the hang watch
PHASE_USES = re.compile(r'(?:timer|phased|\.phase)\("([a-z_]+)"\)')


def test_every_phase_the_code_enters_is_declared():
    used = {name for path in ROOT.rglob("*.py") for name in PHASE_USES.findall(path.read_text())}
    assert used, "the pattern found no phase: it no longer matches how phases are entered"
    assert used - set(PHASES) == set(), "declare these phases in rlkit/phases.py"


def test_every_train_step_phase_is_entered_somewhere():
    """A declared phase no code enters is a stale row."""
    used = {name for path in ROOT.rglob("*.py") for name in PHASE_USES.findall(path.read_text())}
    assert set(PHASES) - used == set()


def test_calls_return_declared_keys_and_readers_derive_from_the_table():
    assert {k for keys in CALL_OUTPUTS.values() for k in keys} <= set(BATCH_KEYS)
    assert CALL_OUTPUTS["compute_log_prob"] == ("old_log_probs",)
    assert set(call_roles()) == {"actor", "rollout", "ref", "critic", "reward_model", "teacher"}
    assert training_calls() == {"actor": "update_actor", "critic": "update_critic"}
    assert role_call("ref", "ref") == "compute_ref_log_prob"
    assert {"rollout.generate", "rollout.validate", "actor.update_policy"} <= set(break_names())


def test_worker_methods_exist_for_every_declared_call():
    """Each declared call is a method of the worker class that plays its role (a renamed method fails here)."""
    from rlkit.workers.actor import ActorWorker, RefWorker
    from rlkit.workers.critic import CriticWorker
    from rlkit.workers.reward_model import RewardModelWorker
    from rlkit.workers.rollout_worker import RolloutWorker
    from rlkit.workers.teacher import TeacherWorker

    classes = {"actor": ActorWorker, "ref": RefWorker, "critic": CriticWorker, "rollout": RolloutWorker,
               "reward_model": RewardModelWorker, "teacher": TeacherWorker}
    for phase in PHASES.values():
        for call in phase.calls:
            if call.method == "sync_weights":
                continue  # the driver's WorkerHandles.sync_weights: the layout's route, not one worker method
            assert hasattr(classes[call.role], call.method), f"{phase.name}: {call.role}.{call.method}"


def test_flop_meter_counts_by_declared_kind():
    import torch
    from transformers import LlamaConfig

    from rlkit.utils.flops import MFUMeter

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=64)
    meter = MFUMeter(cfg, peak=1e12, source="test", actor_epochs=2, critic_epochs=1)
    mask = torch.ones(2, 8, dtype=torch.long)
    forward = meter.step_flops(mask, ["ref"])
    assert forward > 0
    assert meter.step_flops(mask, ["ref", "old_log_prob"]) == 2 * forward
    assert meter.step_flops(mask, ["gen", "adv", "reward"]) == 0
    # a training pass is forward + backward (3x a forward) per epoch
    assert meter.step_flops(mask, ["update_actor"]) == 2 * 3 * forward
