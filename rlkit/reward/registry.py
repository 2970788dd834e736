"""Scorer registry and the data_source -> scorer map.

A scorer is `fn(response, ground_truth, extra_info, **kwargs) -> float | dict`
(a dict carries `score` plus extra per-sample metrics). The row's `data_source`
picks the scorer by name; config can remap data sources without code changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from rlkit.errors import UserError
from rlkit.registry import Registry

Scorer = Callable[..., Any]
SCORERS: Registry[Scorer] = Registry("reward scorer")

_BUILTIN_MODULES = ("gsm8k", "math_equiv", "toy_copy", "code")

#: data_source -> scorer name; `scorer_overrides` in the config take precedence.
DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "HuggingFaceH4/MATH-500": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "lighteval/MATH": "math",
    "rlkit/toy_copy": "toy_copy",
    "rlkit/code": "code",
    "mbpp": "code",
    "google-research-datasets/mbpp": "code",
    "openai_humaneval": "code",
    "openai/openai_humaneval": "code",
}


def load_builtin_scorers() -> None:
    """Import the built-in scorer modules so their `@SCORERS.register` has run."""
    for name in _BUILTIN_MODULES:
        importlib.import_module(f"rlkit.reward.{name}")


def scorer_name_for(data_source: str, overrides: Mapping[str, str] | None = None) -> str:
    """Overrides, then the default map, then a data_source that is itself a scorer name."""
    load_builtin_scorers()
    if overrides and data_source in overrides:
        return overrides[data_source]
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    if data_source in SCORERS:
        return data_source
    raise UserError(
        f"no reward scorer for data_source '{data_source}'. Map it in scorer_overrides "
        f"(e.g. {{'{data_source}': 'math'}}) or give custom_reward_function.path/name. "
        f"Scorers: {', '.join(SCORERS.names())}."
    )


def get_scorer(name: str) -> Scorer:
    load_builtin_scorers()
    return SCORERS.get(name)
