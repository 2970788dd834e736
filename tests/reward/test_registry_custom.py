"""Scorer registry, data_source map and loading a user's reward function."""

from __future__ import annotations

import pytest

from rlkit.errors import UserError
from rlkit.reward import DATA_SOURCES, SCORERS, load_custom_fn, scorer_name_for


def test_builtin_scorers_and_data_sources():
    assert {"gsm8k", "math", "toy_copy", "code"} <= set(SCORERS.names())
    assert scorer_name_for("openai/gsm8k") == "gsm8k"
    for ds in ("HuggingFaceH4/MATH-500", "DigitalLearningGmbH/MATH-lighteval", "lighteval/MATH"):
        assert scorer_name_for(ds) == "math"
    assert scorer_name_for("rlkit/toy_copy") == "toy_copy"
    for ds in ("rlkit/code", "mbpp", "openai_humaneval"):
        assert scorer_name_for(ds) == "code"
    assert scorer_name_for("math") == "math"  # a scorer name works as a data_source
    assert scorer_name_for("openai/gsm8k", {"openai/gsm8k": "math"}) == "math"
    assert all(name in SCORERS for name in DATA_SOURCES.values())


def test_load_custom_fn(tmp_path):
    f = tmp_path / "rw.py"
    f.write_text("def score_it(response, ground_truth, extra_info):\n    return 1.0\n\nVALUE = 3\n")
    assert load_custom_fn(f, "score_it")("a", "b", None) == 1.0
    with pytest.raises(UserError, match="'nope' not found.*score_it"):
        load_custom_fn(f, "nope")
    with pytest.raises(UserError, match="not callable"):
        load_custom_fn(f, "VALUE")
    with pytest.raises(UserError, match="file not found"):
        load_custom_fn(tmp_path / "missing.py", "score_it")
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    with pytest.raises(UserError, match="bad.py line 1"):
        load_custom_fn(bad, "f")
