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


def _distill_cfg(**teachers):
    from rlkit.config.schema import RLConfig

    cfg = RLConfig()
    cfg.distillation.enabled = True
    cfg.distillation.teacher_models = teachers or {"t": {"model_path": "/m"}}
    return cfg


def test_teachers_on_their_own_group_and_config_refusals():
    from rlkit.config.distillation import check_distillation
    from rlkit.trainer.run.run_config import load_config
    from rlkit.trainer.run.run_plan import TEACHER_GROUP, plan_layout

    colocated = plan_layout(_distill_cfg())
    assert "teacher" in colocated.groups[0].roles and len(colocated.groups) == 1
    cfg = _distill_cfg()
    cfg.distillation.nnodes, cfg.distillation.n_gpus_per_node = 1, 1
    own = plan_layout(cfg)
    assert own.groups[-1].name == TEACHER_GROUP and "teacher" not in own.groups[0].roles
    served = {"t": {"model_path": "m", "base_url": "http://127.0.0.1:9/v1"}}
    assert not any("teacher" in g.roles for g in plan_layout(_distill_cfg(**served)).groups)
    topk = _distill_cfg(**served)
    topk.distillation.distillation_loss.loss_mode = "forward_kl_topk"
    for d, message in [
        (topk.distillation, "needs a local teacher"),
        (_distill_cfg(t={"model_path": "/m"}, u={"model_path": "/n"}).distillation, "each needs its own `key`"),
        (_distill_cfg(t={"model_path": "/m", "num_replicas": 2}).distillation, "set it to 0"),
        (_distill_cfg(t={"model_path": "/m", "temperature": 2}).distillation, "is not a teacher key"),
    ]:
        with pytest.raises(UserError, match=message):
            check_distillation(d, sp_size=1)
    # the preset, and a loss name checked against the registry
    base = ["data.train_files=x.parquet", "+distillation.teacher_models.t.model_path=/m"]
    preset = load_config("distill", base).distillation
    assert preset.enabled and not preset.distillation_loss.use_task_rewards
    with pytest.raises(UserError, match="k3"):
        load_config("distill", base + ["distillation.distillation_loss.loss_mode=k9"])
