"""Pass matrix and co-evolution rewards against the hand-computed example of docs/agents.md,
the batch-level reward hook, and the sandbox limits while a whole matrix runs."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rlkit.protocol import Batch
from rlkit.reward.coevolve import (
    CoevolveReward,
    MatrixLimits,
    coder_rewards,
    correct_programs,
    extract_test,
    pass_matrices,
    pass_matrices_many,
)
from rlkit.reward.coevolve import tester_rewards as score_tests  # not named test_* (pytest would collect it)

REF_TESTS = ["assert double(2) == 4", "assert double(0) == 0", "assert double(-3) == -6"]
PROGRAMS = [
    "def double(x):\n    return 2 * x",  # P1 correct
    "def double(x):\n    return x + 2",  # P2 passes 1 of 3
    "def double(x):\n    return x * x",  # P3 passes 2 of 3
]
SOLUTION = "def double(x):\n    return x + x"
GEN_TESTS = ["assert double(5) == 10", "assert double(2) == 4", "assert double(1) == 3", "assert double(0) == 0"]
# rows P1, P2, P3, reference solution
R = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], bool)
A = np.array([[1, 1, 0, 1], [0, 1, 1, 0], [0, 1, 0, 1], [1, 1, 0, 1]], bool)
# no program here runs long: the limit only guards the suite, generous for a loaded 2-core machine (at 1 s a
# sandboxed test timed out under load and a passing test read as failing)
LIMITS = MatrixLimits(per_test_s=10.0, max_workers=4)


def test_reward_math_worked_example():
    coder = coder_rewards(R[:3], A[:3])
    assert coder == pytest.approx([1.0, 1 / 3, 2 / 3])
    correct = correct_programs(R)
    assert correct.tolist() == [True, False, False, True]
    assert score_tests(A, correct).tolist() == pytest.approx([1.0, 0.0, 0.0, 0.5])
    assert score_tests(A, correct, mode="balanced").tolist() == pytest.approx([1.0, 0.5, 0.25, 0.75])


def test_reward_math_edge_cases():
    # no reference tests: coders are scored on the generated tests; correctness is unknown
    assert coder_rewards(np.zeros((2, 0), bool), np.array([[1, 0], [1, 1]], bool)).tolist() == [0.5, 1.0]
    assert correct_programs(np.zeros((2, 0), bool)).tolist() == [False, False]
    assert coder_rewards(np.zeros((2, 0), bool), np.zeros((2, 0), bool)).tolist() == [0.0, 0.0]
    # no known-correct program: a test's validity cannot be judged -> 0 (a test failing everything is not rewarded)
    assert score_tests(np.array([[0, 1]], bool), np.array([False])).tolist() == [0.0, 0.0]
    # every program correct: a valid test gets 1, an invalid one 0
    assert score_tests(np.array([[1, 0], [1, 1]], bool), np.array([True, True])).tolist() == [1.0, 0.0]
    # unknown rows are ignored
    got = score_tests(np.array([[1], [1]], bool), np.array([True, False]), known=np.array([True, False]))
    assert got.tolist() == [1.0]


def test_pass_matrix_in_the_sandbox_matches_the_example():
    ref, gen = pass_matrices([*PROGRAMS, SOLUTION], REF_TESTS, GEN_TESTS, LIMITS)
    assert ref.tolist() == R.tolist()
    assert gen.tolist() == A.tolist()


def test_extract_test():
    assert extract_test("Here:\n```python\nassert f(1) == 2\n```") == "assert f(1) == 2"
    assert extract_test("```python\nprint('no assert')\n```") is None
    assert extract_test("assert g() is None") == "assert g() is None"


class ListTokenizer:
    """Row i of `responses` holds [i + 1]; decoding returns the i-th planned text."""

    def __init__(self, texts):
        self.texts = texts

    def batch_decode(self, ids, skip_special_tokens=True):
        return [self.texts[row[0] - 1] if row else "" for row in ids]


def coevolve_batch(coder_texts, tester_texts, with_solution=True, extra_rows=0):
    texts = coder_texts + tester_texts
    n = len(texts) + extra_rows
    responses = torch.zeros((n, 4), dtype=torch.long)
    mask = torch.zeros((n, 4), dtype=torch.long)
    for i in range(n):
        responses[i, 0] = i + 1
        mask[i, :2] = 1
    gt = '{"tests": ' + str(REF_TESTS).replace("'", '"') + "}"
    info = {"task_id": "p0", "solution": SOLUTION if with_solution else None}
    rows = [("rlkit/code", {**info, "role": "coder"})] * len(coder_texts)
    rows += [("rlkit/code_tester", {**info, "role": "tester"})] * len(tester_texts)
    rows += [("rlkit/toy_copy", {})] * extra_rows
    non_tensors = {
        "data_source": [ds for ds, _ in rows],
        "extra_info": [e for _, e in rows],
        "reward_model": [{"style": "rule", "ground_truth": gt if ds != "rlkit/toy_copy" else "1"} for ds, _ in rows],
    }
    return Batch({"responses": responses, "response_mask": mask}, non_tensors), texts


def test_batch_hook_scores_both_roles():
    coder_texts = [f"```python\n{p}\n```" for p in PROGRAMS]
    tester_texts = [f"```python\n{t}\n```" for t in GEN_TESTS] + ["I refuse to write a test."]
    batch, texts = coevolve_batch(coder_texts, tester_texts)
    out = CoevolveReward(ListTokenizer(texts), LIMITS)(batch)
    scores = out["token_level_scores"]
    assert scores[:, 0].tolist() == pytest.approx([0.0] * len(texts))  # the score sits on the last valid token
    assert scores[:, 1].tolist() == pytest.approx([1.0, 1 / 3, 2 / 3, 1.0, 0.0, 0.0, 0.5, 0.0])
    assert list(out["reward_extra/role"]) == ["coder"] * 3 + ["tester"] * 5
    assert list(out["reward_extra/valid_test"])[3:] == [True, True, False, True, False]
    m = out.meta["metrics"]
    assert m["coevolve/coder_reward/mean"] == [pytest.approx(2 / 3)]
    assert m["coevolve/valid_test/frac"] == [pytest.approx(3 / 5)]
    # judge calls: 1 for the reference tests + 5 for the generated ones; each starts one tester process
    # and one server process per program (4): 6 x (1 + 4)
    assert m["coevolve/sandbox_runs"] == [6 * (1 + 4)]


def test_batch_hook_fallback_and_unpaired_rows():
    from rlkit.reward.manager import RewardManager

    batch, texts = coevolve_batch([f"```python\n{PROGRAMS[0]}\n```"], [], with_solution=False, extra_rows=1)
    texts.append("1")

    class Tok(ListTokenizer):
        pad_token_id = 0

    tok = Tok(texts)
    out = CoevolveReward(tok, LIMITS, fallback=RewardManager(tok, num_workers=1))(batch)
    assert out["token_level_scores"][:, 1].tolist() == pytest.approx([1.0, 1.0])
    assert out.meta["metrics"]["coevolve/unpaired_problems"] == [1.0]


def test_sandbox_limits_hold_during_matrix_execution():
    """Hostile programs and tests in one matrix: each is stopped by its limit, the others are unaffected."""
    programs = [
        "def double(x):\n    return 2 * x",
        "while True:\n    pass",  # never finishes loading
        "x = bytearray(4 << 30)\ndef double(x):\n    return 2 * x",  # over the memory limit
        "print('y' * (1 << 22))\ndef double(x):\n    return 2 * x",  # output flood
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\ndef double(x):\n    return 2 * x",
        "import os\nopen('/tmp/rlkit_coevolve_escape', 'w').write('x')\ndef double(x):\n    return 2 * x",
    ]
    tests = [
        "assert double(3) == 6",
        "import os\nos._exit(0)",  # kills its own sandbox run only
        "while True:\n    pass",  # per-test alarm
        "assert double(4) == 8",
    ]
    start = time.perf_counter()
    [(ref, gen)] = pass_matrices_many([(programs, REF_TESTS, tests)], MatrixLimits(per_test_s=1.0, memory_mb=256,
                                                                                    max_workers=4))
    elapsed = time.perf_counter() - start
    assert ref[0].all() and gen[0].tolist() == [True, False, False, True], "the good program is unaffected"
    assert not ref[1:].any() and not gen[1:].any(), "every hostile program fails everything"
    import os

    assert not os.path.exists("/tmp/rlkit_coevolve_escape")
    assert elapsed < 60, f"matrix took {elapsed:.1f}s"


def test_a_larger_matrix_has_no_spurious_failures():
    """Many judge calls with processes coming and going (a regression: a recycled object id once let a
    new process skip its start-up line, which then read as a protocol error in about 1 cell in 10)."""
    programs = [*PROGRAMS, SOLUTION] * 2
    ref, gen = pass_matrices(programs, REF_TESTS, GEN_TESTS * 2, MatrixLimits(per_test_s=2.0, max_workers=2))
    assert ref.tolist() == np.tile(R, (2, 1)).tolist()
    assert gen.tolist() == np.tile(A, (2, 2)).tolist()
