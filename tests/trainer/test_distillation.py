"""On-policy distillation end to end: a random student learns the toy copy task from a teacher trained in the test.

The teacher is a tiny model trained by plain supervised steps to copy the digit (`save_toy_copy_teacher`, greedy
accuracy 1.0); the student is the random tied-embedding model of the RL learning tests, of the same shape. With
distillation alone (`rlkit train distill`, forward_kl_topk over the teacher's top 8, no task reward) the per-token
KL to the teacher falls every few steps and greedy validation goes from 0 to the teacher's within 30 steps.
GRPO on the task reward alone reaches 0.20 in the same 30 steps (bench/distill_curve.py prints both curves,
docs/distillation.md) and ~0.6 in 100 (test_learning.py). Measured: KL per 5 steps 3.42 2.30 1.69 1.10 0.64 0.31,
greedy validation 0.0 -> 1.0.
"""

from __future__ import annotations

import statistics

import pytest

from rlkit.errors import UserError
from tests.trainer.conftest import fit, learning_overrides, train_rows

STEPS = 30
VAL_KEY = "val/rlkit/toy_copy/score/mean@1"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from rlkit.testing import save_toy_copy_teacher

    return save_toy_copy_teacher(tmp_path_factory.mktemp("teacher") / "copy_teacher")


def _greedy_accuracy(model_path) -> float:
    """The model's greedy first digit on the ten one-digit prompts (what validation scores)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(model_path).eval(), AutoTokenizer.from_pretrained(model_path)
    hits = 0
    for d in range(10):
        text = tok.apply_chat_template([{"role": "user", "content": f"copy the digits : {d}"}], tokenize=False,
                                       add_generation_prompt=True)
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            hits += tok.decode(model(**enc).logits[0, -1].argmax()) == str(d)
    return hits / 10


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_distillation_alone_teaches_the_student_the_teachers_task(toy_data, tiny_model, teacher, tmp_path):
    assert _greedy_accuracy(teacher) == 1.0
    overrides = learning_overrides(
        toy_data, tiny_model, tmp_path, STEPS,
        distillation__distillation_loss__loss_mode="forward_kl_topk", distillation__distillation_loss__topk=8,
        trainer__debug__check_batch_keys=True,  # the teacher's outputs against rlkit/batch_keys.py
    ) + [f"+distillation.teacher_models.copy.model_path={teacher}"]
    summary, rows, _ = fit("distill", overrides, tmp_path / "logs")
    steps = train_rows(rows)
    assert len(steps) == STEPS
    kl = [r["actor/distill_loss"] for r in steps]
    windows = [statistics.fmean(kl[i:i + 5]) for i in range(0, STEPS, 5)]
    print(f"distill: KL per 5 steps {[round(w, 3) for w in windows]}; greedy val {summary.first_val[VAL_KEY]:.3f} "
          f"-> {summary.last_val[VAL_KEY]:.3f}; teacher {statistics.fmean(r['timing_s/teacher'] for r in steps):.3f}"
          f" s/step of {statistics.median(summary.step_seconds):.2f}")
    assert all(b < a for a, b in zip(windows, windows[1:])), windows  # falls steadily
    assert windows[-1] < windows[0] / 4
    assert summary.first_val[VAL_KEY] < 0.2
    assert summary.last_val[VAL_KEY] > 0.8  # the teacher's is 1.0
    last = steps[-1]
    assert last["distill/scored_token_frac"] == 1.0 and last["distill/teacher_failed"] == 0
    assert "timing_s/teacher" in last and "memory/compute_teacher_log_prob/rss_peak_gb" in last


def test_teachers_on_their_own_group_and_config_refusals(tmp_path):
    from rlkit.trainer.run_config import load_config
    from rlkit.trainer.workers_setup import TEACHER_GROUP, plan_layout

    base = ["data.train_files=x.parquet", "+distillation.teacher_models.t.model_path=/m"]
    colocated = plan_layout(load_config("distill", base))
    assert "teacher" in colocated.groups[0].roles and len(colocated.groups) == 1
    own = plan_layout(load_config("distill", base + ["distillation.nnodes=1", "distillation.n_gpus_per_node=1"]))
    assert [g.name for g in own.groups][-1] == TEACHER_GROUP and "teacher" not in own.groups[0].roles
    served = base + ["+distillation.teacher_models.t.base_url=http://127.0.0.1:9/v1"]
    assert not any("teacher" in g.roles for g in plan_layout(load_config("distill", served)).groups)
    for extra, message in [
        (["distillation.distillation_loss.loss_mode=forward_kl_topk"], "needs a local teacher"),
        (["+distillation.teacher_models.u.model_path=/n"], "each needs its own `key`"),
        (["distillation.distillation_loss.loss_mode=k9"], "k3"),
        (["+distillation.teacher_models.t.num_replicas=2"], "set it to 0"),
        (["+distillation.teacher_models.t.temperature=2"], "is not a teacher key"),
    ]:
        with pytest.raises(UserError, match=message):
            load_config("distill", (served if "topk" in extra[0] else base) + extra)
