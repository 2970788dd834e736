"""The phases of a training step, declared once: what each one calls on which role, what the call returns, the
name a worker announces for `trainer.debug.break_at`, the roles at work, and how its FLOPs count.

A phase's name is the driver's timer name (`with timer("ref"):` -> `timing_s/ref`), the phase `status.json` shows
and the one the hang watch names. Every reader derives its own view from `PHASES`: the batch-key contract
(rlkit/batch_keys.py `CALL_OUTPUTS`), `--debug`'s checked roles (trainer/step/key_checks.py), the breakpoint names
(debug/breakpoints.py), the FLOP meter (utils/flops.py), `rlkit top`'s busy roles (runs/live.py), the console's
timing rows (utils/console_tracker.py) and `rlkit debug replay`'s calls (trainer/replay/replay.py). A new phase is
one row here, its `with timer(...)` in `RLTrainer.train_step`, and the worker method it calls.
"""

from __future__ import annotations

from dataclasses import dataclass

#: what the rollout engine's generate_sequences returns at least (it may add declared keys)
GENERATED = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")


@dataclass(frozen=True)
class Call:
    """A worker call a phase makes: the role and method the driver calls, the batch keys it must return, and the
    phase name the worker announces with `maybe_break` (None: it announces none)."""

    role: str
    method: str
    outputs: tuple[str, ...] = ()
    breakpoint: str | None = None


@dataclass(frozen=True)
class Phase:
    """One phase of a step (or of the loop around it).

    `flops`: "forward" = one no-grad forward of the calling role's model over the batch's tokens; "train" = a
    forward and a backward per epoch of that role (`ppo_epochs`); None = no counted matmuls (`perf/mfu`)."""

    name: str
    calls: tuple[Call, ...] = ()
    busy: tuple[str, ...] = ()  # the roles at work while it runs (`rlkit top`); the others wait
    flops: str | None = None
    console: bool = False  # its timing_s/<name> is a row of the console table
    meaning: str = ""


def _phases(*rows: Phase) -> dict[str, Phase]:
    return {p.name: p for p in rows}


GENERATE = Call("rollout", "generate_sequences", GENERATED, "rollout.generate")

PHASES: dict[str, Phase] = _phases(
    # the step (RLTrainer.train_step), in its order
    Phase("gen", (GENERATE, Call("reward_model", "compute_rm_score", ("rm_scores",), "reward_model.compute_rm_score")),
          busy=("rollout", "reward_model", "actor"), console=True,
          meaning="the rollout source's next batch, rewarded (includes reward, gen_baseline, gen_wait)"),
    Phase("gen_wait", busy=("rollout",), meaning="async modes: waiting for the batch generated in the background"),
    Phase("reward", busy=("reward_model",), meaning="the reward stage (manager, model reward, judge)"),
    Phase("gen_baseline", (GENERATE,), busy=("rollout",), meaning="ReMax: the greedy baseline's generation"),
    Phase("old_log_prob", (Call("actor", "compute_log_prob", ("old_log_probs",), "actor.compute_log_prob"),),
          busy=("actor",), flops="forward", meaning="the policy's log-probs before this step's update"),
    Phase("ref", (Call("ref", "compute_ref_log_prob", ("ref_log_prob",), "ref.compute_log_prob"),),
          busy=("ref", "actor"), flops="forward", console=True, meaning="the reference model's log-probs"),
    Phase("teacher", (Call("teacher", "compute_teacher_log_prob", ("teacher_log_probs",), "teacher.compute_log_prob"),),
          busy=("teacher",), meaning="distillation: each sampled token's log-prob under its teacher"),
    Phase("values", (Call("critic", "compute_values", ("values",), "critic.compute_values"),),
          busy=("critic",), flops="forward", meaning="the critic's value of each token"),
    Phase("adv", meaning="driver: reward shaping (in-reward KL) and the registered advantage estimator"),
    Phase("update_critic", (Call("critic", "update_critic", (), "critic.update"),),
          busy=("critic",), flops="train", console=True, meaning="the critic's update"),
    Phase("update_actor", (Call("actor", "update_actor", (), "actor.update_policy"),),
          busy=("actor",), flops="train", console=True, meaning="the policy's update"),
    Phase("update_weights", (Call("actor", "sync_weights"),), busy=("actor", "rollout"),
          meaning="the new weights to the rollout engines"),
    Phase("dump_rollouts", meaning="trainer.rollout_data_dir: the step's samples as text"),
    # the loop around the step (TrainerBase.fit)
    Phase("step", busy=("actor", "rollout"), meaning="a whole step (the hang watch's outer phase)"),
    Phase("validate", (Call("rollout", "generate_sequences", GENERATED, "rollout.validate"),),
          busy=("rollout", "actor"), meaning="validation: generate and score the val set"),
    Phase("checkpoint", busy=("actor", "critic"), meaning="the status file's phase while a checkpoint is saved"),
    Phase("save_checkpoint", busy=("actor", "critic"), meaning="the hang watch's name for the same"),
)


def calls() -> list[Call]:
    """Every declared worker call, in phase order (a call several phases make appears once per phase)."""
    return [c for p in PHASES.values() for c in p.calls]


def call_outputs() -> dict[str, tuple[str, ...]]:
    """method -> the batch keys its call must return (calls that return keys only)."""
    return {c.method: c.outputs for c in calls() if c.outputs}


def call_roles() -> tuple[str, ...]:
    """The roles the driver calls, in first-seen order."""
    return tuple(dict.fromkeys(c.role for c in calls()))


def break_names() -> tuple[str, ...]:
    """Every phase name a worker announces with `maybe_break` (trainer.debug.break_at's vocabulary)."""
    return tuple(dict.fromkeys(c.breakpoint for c in calls() if c.breakpoint))


def role_call(phase: str, role: str) -> str:
    """The method `role` runs in `phase` (KeyError: it runs none there)."""
    for call in PHASES[phase].calls:
        if call.role == role:
            return call.method
    raise KeyError(f"{role} makes no call in phase {phase}")


def training_calls() -> dict[str, str]:
    """role -> its update method: the calls whose phase trains (what `rlkit debug replay` replays)."""
    return {c.role: c.method for p in PHASES.values() if p.flops == "train" for c in p.calls}
