"""Custom reward functions: verl's signature works unchanged, bad signatures fail at start-up,
a function that fails on every sample stops the run, and breakpoint() in one opens pdb."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlkit.errors import UserError
from rlkit.reward import RewardManager, bind_custom
from rlkit.reward.custom import ACCEPTED_FORMS

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["#### 4", "#### 5"]
TRUTHS = ["4", "4"]
SOURCES = ["openai/gsm8k", "mine"]
INFOS = [{"index": 0}, {"index": 1}]

VERL_FILE = '''
seen = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    seen.append((data_source, solution_str, ground_truth, extra_info))
    return float(solution_str.split("####")[-1].strip() == ground_truth)
'''


def _score(fn_or_spec, **kwargs):
    manager = RewardManager(custom_fn=fn_or_spec, **kwargs)
    return [r.score for r in manager.score_texts(TEXTS, TRUTHS, SOURCES, INFOS)], manager


def test_a_verl_style_file_scores_unchanged(tmp_path):
    path = tmp_path / "verl_reward.py"
    path.write_text(VERL_FILE)
    scores, manager = _score({"path": str(path), "name": "compute_score"})
    assert scores == [1.0, 0.0]
    seen = sys.modules[manager.custom.fn.__module__].seen
    assert sorted(seen, key=lambda s: s[0]) == [
        ("mine", "#### 5", "4", {"index": 1}),
        ("openai/gsm8k", "#### 4", "4", {"index": 0}),
    ]


@pytest.mark.parametrize(
    "source",
    [
        # verl, other orders, subsets, and **kwargs catching what is not named
        "def f(data_source, solution_str, ground_truth, extra_info=None): return CHECK(solution_str, ground_truth)",
        "def f(solution_str, ground_truth, data_source, extra_info): return CHECK(solution_str, ground_truth)",
        "def f(ground_truth, solution_str): return CHECK(solution_str, ground_truth)",
        "def f(solution_str, **kw): return CHECK(solution_str, kw['ground_truth'], kw)",
        "def f(**kw): return CHECK(kw['solution_str'], kw['ground_truth'], kw)",
        "async def f(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return CHECK(solution_str, ground_truth)",
        # rlkit's names (by name) and any names (positionally), data_source by keyword when asked for
        "def f(response, ground_truth, extra_info=None, **kw): return CHECK(response, ground_truth, kw)",
        "def f(text, answer, info): return CHECK(text, answer)",
        "def f(text, answer): return CHECK(text, answer)",
        "def f(text, ground_truth, extra_info, data_source=None): return CHECK(text, ground_truth, ds=data_source)",
        "def f(*args): return CHECK(args[0], args[1])",
    ],
)
def test_accepted_signatures_bind_by_name_or_position(source):
    def check(response, gt, kw=None, ds="mine"):
        if kw is not None:
            assert kw["data_source"] in SOURCES and kw.get("extra_info", {"index": 0})["index"] in (0, 1)
        assert ds in SOURCES
        return float(response.split("####")[-1].strip() == gt)

    scope = {"CHECK": check}
    exec(source, scope)
    scores, _ = _score(scope["f"])
    assert scores == [1.0, 0.0], source


def test_scorer_kwargs_are_passed_and_checked():
    def f(solution_str, ground_truth, bonus=0.0):
        return float(solution_str.endswith(ground_truth)) + bonus

    scores, _ = _score(f, scorer_kwargs={"custom": {"bonus": 0.5}})
    assert scores == [1.5, 0.5]
    with pytest.raises(UserError, match=r"scorer_kwargs\.custom\.malus is not a parameter"):
        RewardManager(custom_fn=f, scorer_kwargs={"custom": {"malus": 1}})


@pytest.mark.parametrize(
    "source,why",
    [
        ("def f(data_source, text, gt): pass", "parameter 'text' is none of"),
        ("def f(gt, response): pass", "parameter 'response' would receive the ground truth"),
        ("def f(): pass", "takes no positional argument"),
        ("def f(a, b, c, d): pass", "parameter 'd' has no value"),
    ],
)
def test_bad_signatures_fail_at_start_up_naming_the_accepted_forms(tmp_path, source, why):
    path = tmp_path / "bad_reward.py"
    path.write_text(source + "\n")
    with pytest.raises(UserError) as info:
        RewardManager(custom_fn={"path": str(path), "name": "f"})
    msg = str(info.value)
    assert why in msg and ACCEPTED_FORMS in msg and f"'f' in {path}" in msg


def test_a_function_failing_on_every_sample_stops_the_run(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def compute_score(solution_str, ground_truth):\n    return 1 / 0\n")
    manager = RewardManager(custom_fn={"path": str(path)})
    with pytest.raises(UserError, match=r"failed on all 2 samples.*ZeroDivisionError.*bug in the function"):
        manager.score_texts(TEXTS, TRUTHS, SOURCES, INFOS)
    # one sample scoring is enough to go on: a bad sample is not a config bug
    path.write_text("def compute_score(solution_str, ground_truth):\n    return 1 / int(solution_str[-1] == '4')\n")
    res = RewardManager(custom_fn={"path": str(path)}).score_texts(TEXTS, TRUTHS, SOURCES, INFOS)
    assert [r.score for r in res] == [1.0, 0.0] and res[1].error.startswith("ZeroDivisionError")


def test_binding_is_decided_once():
    calls = []

    def f(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(data_source)
        return 1.0

    bound = bind_custom(f)
    assert bound.keyword == {"data_source": "data_source", "solution_str": "response",
                             "ground_truth": "ground_truth", "extra_info": "extra_info"}
    assert bound("r", "g", None, "ds") == 1.0 and calls == ["ds"]


PDB_SCRIPT = textwrap.dedent('''
    from rlkit.reward import RewardManager

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        marker = "inside-the-reward-" + solution_str
        breakpoint()
        return 1.0

    manager = RewardManager(custom_fn=compute_score, timeout_s=1.0)
    res = manager.score_texts(["abc"], ["x"], ["mine"])
    print("RESULT", res[0].score, res[0].error, flush=True)
''')


def test_breakpoint_in_a_custom_function_opens_pdb_and_is_not_timed_out(tmp_path):
    """The driver computes rewards: breakpoint() is plain pdb on its terminal, and a sample being
    debugged is not cut off by the per-sample timeout (1 s here; the 'user' answers after 3 s)."""
    script = tmp_path / "debug_reward.py"
    script.write_text(PDB_SCRIPT)
    env = {**os.environ, "PYTHONBREAKPOINT": "", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    time.sleep(3.0)  # longer than timeout_s
    out, _ = proc.communicate("p marker\nc\n", timeout=120)
    assert proc.returncode == 0, out
    assert "(Pdb)" in out and "'inside-the-reward-abc'" in out
    assert "RESULT 1.0 None" in out


def test_dry_run_checks_the_signature_before_anything_starts(tmp_path):
    from tests.trainer.conftest import run_cli

    path = tmp_path / "bad_reward.py"
    path.write_text("def compute_score(data_source, text, gt):\n    return 1.0\n")
    res = run_cli("train", "grpo", "--dry-run", "actor_rollout_ref.rollout.name=hf",
                  f"custom_reward_function.path={path}", f"trainer.default_local_dir={tmp_path}/ckpt")
    assert res.returncode == 1
    assert f"custom_reward_function: 'compute_score' in {path} has a signature rlkit cannot call" in res.stderr
    assert "Traceback" not in res.stderr
