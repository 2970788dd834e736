"""Load a user's reward function from `custom_reward_function.path` / `.name` and bind it by name.

Accepted forms (checked once, at start-up, by `bind_custom`):
- verl's, called by keyword: `compute_score(data_source, solution_str, ground_truth, extra_info=None)`;
  any subset of these names, in any order, works (plus `response` as a synonym of `solution_str`);
- rlkit's: `compute_score(response, ground_truth, extra_info=None, **kwargs)`;
- any other names, called positionally: `fn(response, ground_truth, extra_info)`.
A `**kwargs` parameter receives the verl names the function does not list (`data_source`...).
The function returns a float or a dict with `score`; it may be `async def`.
`reward_model.scorer_kwargs.custom` adds keyword arguments.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

DEFAULT_NAME = "compute_score"


def load_custom_fn(path: str | Path, name: str = DEFAULT_NAME) -> Callable[..., Any]:
    """Import `path` as a module and return its function `name`; a UserError names what is missing."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"custom_reward_function.path: file not found: {file}")
    if file.suffix != ".py":
        raise UserError(f"custom_reward_function.path: {file} is not a .py file")
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    module_name = f"rlkit_custom_reward_{file.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"custom_reward_function.path: cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so pickling (Ray) and dataclasses inside the file work
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        raise UserError(f"custom_reward_function.path: {file} line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise UserError(f"custom_reward_function.path: importing {file} failed: {exc!r}") from exc
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        found = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_"))
        what = "is not callable" if fn is not None else "not found"
        raise UserError(
            f"custom_reward_function.name: '{name}' {what} in {file}. Functions there: {', '.join(found) or 'none'}."
        )
    return fn


#: parameter name -> what it receives; the first name of each slot is the one passed through **kwargs
NAMES: dict[str, str] = {
    "data_source": "data_source",
    "solution_str": "response",
    "response": "response",
    "ground_truth": "ground_truth",
    "extra_info": "extra_info",
}
POSITIONAL_SLOTS = ("response", "ground_truth", "extra_info")
ACCEPTED_FORMS = (
    "compute_score(data_source, solution_str, ground_truth, extra_info=None) (verl, by name), "
    "compute_score(response, ground_truth, extra_info=None, **kwargs) (rlkit), "
    "or fn(response, ground_truth, extra_info) with any names (positional)"
)
_P = inspect.Parameter


@dataclass(frozen=True)
class CustomReward:
    """A user function with its arguments bound once: `reward(response, ground_truth, extra_info, data_source)`.

    keyword: parameter name -> slot (by-name form); positional: how many leading slots go positionally.
    """

    fn: Callable[..., Any]
    label: str
    keyword: dict[str, str] = field(default_factory=dict)
    positional: int = 0
    fixed: dict[str, Any] = field(default_factory=dict)

    def __call__(self, response: str, ground_truth: Any, extra_info: Any, data_source: str) -> Any:
        values = {"response": response, "ground_truth": ground_truth, "extra_info": extra_info,
                  "data_source": data_source}
        args = [values[slot] for slot in POSITIONAL_SLOTS[: self.positional]]
        kwargs = {name: values[slot] for name, slot in self.keyword.items()}
        return self.fn(*args, **kwargs, **self.fixed)


def bind_custom(
    fn: Callable[..., Any], fixed: Mapping[str, Any] | None = None, label: str | None = None
) -> CustomReward:
    """Decide how to call `fn` (by name, else positionally); a UserError names the accepted forms."""
    label = label or getattr(fn, "__qualname__", repr(fn))
    fixed = dict(fixed or {})
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no introspectable signature (some builtins): the positional form
        return CustomReward(fn, label, positional=3, fixed=fixed)
    by_name, why_not_name = _by_name(params, fixed)
    if by_name is not None:
        return CustomReward(fn, label, keyword=by_name, fixed=fixed)
    positional, why_not_pos = _by_position(params, fixed)
    if positional is not None:
        return CustomReward(fn, label, positional=positional[0], keyword=positional[1], fixed=fixed)
    raise UserError(
        f"custom_reward_function: {label} has a signature rlkit cannot call ({why_not_name}; {why_not_pos}). "
        f"Accepted forms: {ACCEPTED_FORMS}"
    )


def _unknown_fixed(params: list[inspect.Parameter], fixed: Mapping[str, Any]) -> str | None:
    """A scorer_kwargs.custom key the function cannot take, if any."""
    if any(p.kind is _P.VAR_KEYWORD for p in params):
        return None
    names = {p.name for p in params if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
    extra = sorted(set(fixed) - names)
    return extra[0] if extra else None


def _by_name(params: list[inspect.Parameter], fixed: Mapping[str, Any]) -> tuple[dict[str, str] | None, str]:
    """(parameter name -> slot) when every required parameter is a known name, else (None, why)."""
    binding: dict[str, str] = {}
    for p in params:
        if p.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
            continue
        if p.name in fixed:
            continue
        if p.name in NAMES and p.kind is not _P.POSITIONAL_ONLY:
            binding[p.name] = NAMES[p.name]
        elif p.default is _P.empty:
            return None, f"by name: parameter '{p.name}' is none of {', '.join(NAMES)}"
    if any(p.kind is _P.VAR_KEYWORD for p in params):  # verl passes every name; **kwargs takes the rest
        bound = set(binding.values())
        for name, slot in NAMES.items():
            if slot not in bound:
                binding[name] = slot
                bound.add(slot)
    if "response" not in binding.values():
        return None, "by name: no parameter receives the response (solution_str or response)"
    bad = _unknown_fixed(params, fixed)
    if bad:
        return None, f"reward_model.scorer_kwargs.custom.{bad} is not a parameter"
    return binding, ""


def _by_position(
    params: list[inspect.Parameter], fixed: Mapping[str, Any]
) -> tuple[tuple[int, dict[str, str]] | None, str]:
    """((leading positional slots, keyword extras), "") for fn(response, ground_truth, extra_info), else (None, why)."""
    positional = [p for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    star = any(p.kind is _P.VAR_POSITIONAL for p in params)
    count = 3 if star else min(3, len(positional))
    if count == 0:
        return None, "positionally: it takes no positional argument"
    for slot, p in zip(POSITIONAL_SLOTS, positional[:count]):
        if p.name in NAMES and NAMES[p.name] != slot:
            return None, f"positionally: parameter '{p.name}' would receive the {slot.replace('_', ' ')}"
    keyword: dict[str, str] = {}
    for p in params[count:] if not star else [p for p in params if p.kind is _P.KEYWORD_ONLY]:
        if p.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD) or p.name in fixed:
            continue
        if p.name == "data_source" and p.kind is not _P.POSITIONAL_ONLY:
            keyword["data_source"] = "data_source"
        elif p.default is _P.empty:
            return None, f"positionally: parameter '{p.name}' has no value (give it a default)"
    if "data_source" not in keyword and any(p.kind is _P.VAR_KEYWORD for p in params):
        keyword["data_source"] = "data_source"  # **kwargs receives data_source=, as when called by name
    bad = _unknown_fixed(params, fixed)
    if bad:
        return None, f"reward_model.scorer_kwargs.custom.{bad} is not a parameter"
    return (count, keyword), ""
