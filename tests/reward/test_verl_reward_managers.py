"""verl's reward managers by name (`reward_model.reward_manager=batch|dapo|prime`), by what they score on
hand-made samples: `batch` calls the user's function once with lists, `dapo` adds verl's overlong penalty
(the same implementation as `reward_model.overlong_buffer`), `prime` scores on parallel workers with a timeout."""

from __future__ import annotations

import pytest
import torch

from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.reward.registry import build_reward_manager
from rlkit.testing import build_tiny_tokenizer
from rlkit.trainer.run.run_config import load_config
from rlkit.trainer.step.advantage_stage import shape_rewards

HF = ["actor_rollout_ref.rollout.name=hf"]

BATCH_FN = '''
def compute_score(data_sources, solution_strs, ground_truths, extra_infos, bonus=0.0):
    """Lists in, one score per sample out; `count` rows score the batch size (proof of one call)."""
    assert isinstance(solution_strs, list) and all(isinstance(e, dict) for e in extra_infos)
    out = []
    for ds, s, g in zip(data_sources, solution_strs, ground_truths):
        if ds == "count":
            out.append(float(len(solution_strs)))
        else:
            out.append({"score": float(s == g) + bonus, "acc": s == g})
    return out
'''
CONSTANT_FN = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
SLOW_FN = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "9":
        time.sleep(2)
    return float(len(solution_str.split()))
'''


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def make_batch(tok, rows, R=8):
    """rows: (data_source, response text, ground truth)."""
    responses = torch.full((len(rows), R), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), R), dtype=torch.long)
    for i, (_, text, _) in enumerate(rows):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    return Batch({"responses": responses, "response_mask": mask},
                 {"data_source": [r[0] for r in rows],
                  "reward_model": [{"style": "rule", "ground_truth": r[2]} for r in rows],
                  "extra_info": [{"index": i} for i in range(len(rows))]})


def manager(tmp_path, source: str, *overrides: str, tok=None):
    path = tmp_path / "reward.py"
    path.write_text(source)
    cfg = load_config("grpo", [*HF, f"custom_reward_function.path={path}", *overrides])
    return build_reward_manager(cfg, tok), cfg


def scores(out: Batch) -> list[float]:
    return out["token_level_scores"].sum(-1).tolist()


def test_batch_calls_the_function_once_with_lists(tmp_path, tok):
    m, _ = manager(tmp_path, BATCH_FN, "reward_model.reward_manager=batch", "reward_model.reward_kwargs={bonus: 0.5}",
                   tok=tok)
    batch = make_batch(tok, [("a", "1 2", "1 2"), ("a", "3", "1 2"), ("count", "4", ""), ("count", "5 6 7", "")])
    out = m(batch)
    # a: exact match + the reward_kwargs bonus; count: the batch size the one call saw
    assert scores(out) == pytest.approx([1.5, 0.5, 4.0, 4.0])
    assert out["token_level_scores"][3, 2] == 4.0  # on the last valid token
    assert list(out["reward_extra/acc"]) == [True, False, None, None]
    assert out.meta["metrics"]["reward/errors"] == [0.0]


def test_batch_function_errors_are_one_line(tmp_path, tok):
    m, _ = manager(tmp_path, "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
                   "    return [1.0]\n", "reward_model.reward_manager=batch", tok=tok)
    with pytest.raises(UserError, match=r"returned 1 scores for a batch of 2 samples"):
        m(make_batch(tok, [("a", "1", "1"), ("a", "2", "1")]))
    with pytest.raises(UserError, match="reward_manager=batch scores with your function: set custom_reward_function"):
        load_config("grpo", [*HF, "reward_model.reward_manager=batch"])


def test_batch_signature_is_checked_before_the_run(tmp_path):
    from rlkit.trainer.run.preflight import Preflight, check_custom_reward

    path = tmp_path / "reward.py"
    path.write_text(CONSTANT_FN)  # a per-sample function: not what the batch manager calls
    cfg = load_config("grpo", [*HF, "reward_model.reward_manager=batch", f"custom_reward_function.path={path}"])
    report = Preflight(cfg)
    check_custom_reward(report)
    assert len(report.problems) == 1 and "cannot be called as reward_model.reward_manager=batch" in report.problems[0]


def test_dapo_adds_verls_overlong_penalty_by_hand(tmp_path, tok):
    cfg_kwargs = "reward_model.reward_kwargs={max_resp_len: 8, overlong_buffer_cfg: {enable: true, len: 4, " \
                 "penalty_factor: 1.0, log: true}}"
    m, _ = manager(tmp_path, CONSTANT_FN, "reward_model.reward_manager=dapo", cfg_kwargs, tok=tok)
    batch = make_batch(tok, [("x", "1 2", ""), ("x", "1 2 3 4 5", ""), ("x", "1 2 3 4 5 6", ""),
                             ("x", "1 2 3 4 5 6 7 8", "")])
    out = m(batch)
    # free up to 8 - 4 = 4 tokens, then -1/4 per token: 5 -> -0.25, 6 -> -0.5, 8 -> -1.0; score 1.0 each
    assert scores(out) == pytest.approx([1.0, 0.75, 0.5, 0.0])
    assert list(out["reward_extra/overlong_reward"]) == pytest.approx([0.0, -0.25, -0.5, -1.0])
    assert list(out["reward_extra/overlong"]) == [False, True, True, True]
    assert out.meta["metrics"]["reward/overlong_penalty/mean"] == [pytest.approx(-0.4375)]
    # verl's formula has no floor: max_resp_len 6 below the 8 tokens -> -(8 - 2) / 4 = -1.5
    short = "reward_model.reward_kwargs={max_resp_len: 6, overlong_buffer_cfg: {enable: true, len: 4}}"
    m6, _ = manager(tmp_path, CONSTANT_FN, "reward_model.reward_manager=dapo", short, tok=tok)
    assert scores(m6(batch))[3] == pytest.approx(1.0 - 1.5)


def test_overlong_buffer_is_the_same_penalty_after_scoring(tmp_path, tok):
    """`reward_model.overlong_buffer` (any manager, after scoring) gives the dapo manager's numbers."""
    m, cfg = manager(tmp_path, CONSTANT_FN, "data.max_response_length=8",
                     "reward_model.overlong_buffer={enable: true, len: 4, penalty_factor: 1.0}", tok=tok)
    batch = make_batch(tok, [("x", "1 2", ""), ("x", "1 2 3 4 5", ""), ("x", "1 2 3 4 5 6 7 8", "")])
    batch.union(m(batch))
    assert scores(batch) == pytest.approx([1.0, 1.0, 1.0])  # the score itself is untouched
    metrics = shape_rewards(batch, cfg, kl_ctrl=None)
    assert batch["token_level_rewards"].sum(-1).tolist() == pytest.approx([1.0, 0.75, 0.0])
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(-1.25 / 3)


@pytest.mark.parametrize("overrides, expect", [
    (["reward_model.reward_kwargs={overlong_buffer_cfg: {enable: true, len: 4}}"],
     "overlong_buffer_cfg.enable needs reward_model.reward_kwargs.max_resp_len"),
    (["reward_model.reward_kwargs={max_resp_len: 8, overlong_buffer_cfg: {enable: true, len: 4}}",
      "reward_model.overlong_buffer={enable: true, len: 4}"], "the penalty would count twice"),
    (["reward_model.reward_kwargs={max_resp_len: 8, overlong_buffer_cfg: {enable: true, lenght: 4}}"],
     "overlong_buffer_cfg.lenght is not an overlong buffer option"),
    (["reward_model.reward_kwargs={overlong: 1}"], "reward_kwargs.overlong: not an option of reward manager 'dapo'"),
])
def test_dapo_config_errors(overrides, expect):
    with pytest.raises(UserError, match=expect):
        load_config("grpo", [*HF, "reward_model.reward_manager=dapo", *overrides])


def test_prime_scores_in_parallel_with_a_timeout(tmp_path, tok):
    m, _ = manager(tmp_path, SLOW_FN, "reward_model.reward_manager=prime", "reward_model.timeout_s=0.5",
                   "reward_model.reward_kwargs={num_processes: 3}", tok=tok)
    assert m.num_workers == 3  # verl's num_processes
    out = m(make_batch(tok, [("x", "1 2", ""), ("x", "9", ""), ("x", "1 2 3", "")]))
    assert scores(out) == [2.0, 0.0, 3.0]  # the slow sample timed out and scores 0; the others are scored
    assert out.meta["metrics"]["reward/timeouts"] == [1.0]
    with pytest.raises(UserError, match="num_processes=0 must be a whole number >= 1"):
        load_config("grpo", [*HF, "reward_model.reward_manager=prime", "reward_model.reward_kwargs={num_processes: 0}"])
