"""The two reward registries: reward managers (the batch stage) and scorers (one sample each).

A reward manager turns a whole rollout Batch into `token_level_scores` (B, R), plus
`reward_extra/<name>` columns and `meta['metrics']`; `reward_model.reward_manager` names it
(verl's key; `rule`, alias `naive`, is the default). verl's other managers: `batch` (the user's function
scores the whole batch in one call, rlkit.reward.batch_manager), `dapo` (score + overlong penalty,
rlkit.reward.dapo_manager), `prime` (parallel per-sample scoring, rlkit.reward.prime_manager, which says
what differs from verl's). Each entry is a class with
`from_config(cfg, tokenizer, **reward_model.reward_kwargs)`, `__call__(batch) -> Batch` and,
optionally, `check_config(cfg, **reward_kwargs)` run with the config checks (before Ray starts) and
`check_custom(cfg, fn, label)`, the pre-flight check of `custom_reward_function` for a manager that calls
it in a form of its own (`batch`; the others call it per sample, rlkit.reward.custom).

A scorer is `fn(response, ground_truth, extra_info, **kwargs) -> float | dict`
(a dict carries `score` plus extra per-sample metrics). The row's `data_source`
picks the scorer by name; config can remap data sources without code changes.
The `rule` manager calls one scorer per sample; other managers may see the batch whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from rlkit.errors import UserError
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig
    from rlkit.protocol import Batch

Scorer = Callable[..., Any]
_BUILTIN_MODULES = ("gsm8k", "math_equiv", "toy_copy", "code", "shapes")  # their import registers the scorers
SCORERS: Registry[Scorer] = Registry("reward scorer", fill=tuple(f"rlkit.reward.{m}" for m in _BUILTIN_MODULES))


class RewardFn(Protocol):
    def __call__(self, batch: Batch) -> Batch: ...


#: name -> reward manager class (see the module docstring for what a class provides), filled by these modules
_MANAGER_MODULES = ("manager", "coevolve", "batch_manager", "dapo_manager", "prime_manager")
REWARD_MANAGERS: Registry[Any] = Registry("reward manager", fill=tuple(f"rlkit.reward.{m}" for m in _MANAGER_MODULES))

#: data_source -> scorer name; `scorer_overrides` in the config take precedence.
DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "HuggingFaceH4/MATH-500": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "lighteval/MATH": "math",
    "rlkit/toy_copy": "toy_copy",
    "rlkit/shapes": "shapes",
    "hiyouga/geometry3k": "math",
    "rlkit/code": "code",
    "mbpp": "code",
    "google-research-datasets/mbpp": "code",
    "openai_humaneval": "code",
    "openai/openai_humaneval": "code",
}


def scorer_name_for(data_source: str, overrides: Mapping[str, str] | None = None) -> str:
    """Overrides, then the default map, then a data_source that is itself a scorer name."""
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
    return SCORERS.get(name)


# ---------------------------------------------------------------------------------------------- managers
def reward_manager_class(name: str) -> Any:
    return REWARD_MANAGERS.get(name)


def check_reward_manager(cfg: RLConfig) -> None:
    """The configured manager exists, accepts `reward_model.reward_kwargs`, and its own checks pass."""
    rm = cfg.reward_model
    if rm.reward_manager not in REWARD_MANAGERS:
        raise UserError(f"reward_model.reward_manager='{rm.reward_manager}' is not registered; "
                        f"choose one of {REWARD_MANAGERS.names()}")
    cls = REWARD_MANAGERS.get(rm.reward_manager)
    kwargs = dict(rm.reward_kwargs or {})
    sig = inspect.signature(cls.from_config)
    try:
        sig.bind(cfg, None, **kwargs)
    except TypeError:
        accepted = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        unknown = ", ".join(f"reward_model.reward_kwargs.{k}" for k in kwargs if k not in accepted)
        raise UserError(f"{unknown or 'reward_model.reward_kwargs'}: not an option of reward manager "
                        f"'{rm.reward_manager}'; it accepts {accepted or 'no reward_kwargs'}") from None
    check = getattr(cls, "check_config", None)
    if check is not None:
        check(cfg, **kwargs)
    from rlkit.reward.overlong import OverlongBuffer

    key = "reward_model.overlong_buffer"
    OverlongBuffer.parse(rm.overlong_buffer, key).check_length(cfg.data.max_response_length, key)


def build_reward_manager(cfg: RLConfig, tokenizer: Any) -> RewardFn:
    """The reward stage of a run: `reward_model.reward_manager` built with `reward_model.reward_kwargs`."""
    rm = cfg.reward_model
    return reward_manager_class(rm.reward_manager).from_config(cfg, tokenizer, **dict(rm.reward_kwargs or {}))
