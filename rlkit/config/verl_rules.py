"""How a verl config key is read by rlkit: implemented, mapped (with a notice) or refused (with the fix).

verl's run scripts set keys of verl's own schema. rlkit's schema (schema.py) holds the keys it implements under
verl's name; every other verl key matches one rule of `rlkit.config.verl_keys.VERL_KEYS`:

- `alias`: implemented under another rlkit key with the same meaning (the value moves there, no notice);
- `mapped`: rlkit's nearest equivalent is set (or nothing needs setting) and one notice line says what was done;
- `refused`: the value asks for what rlkit does not have: one error line with why and what to use instead.
  A refused key set to a value that asks for nothing rlkit lacks (its `inert` values: `false`, `null`, the
  feature's own switch off) is accepted with a notice, since verl itself would do nothing with it.

`translate` applies the rules to a flat {dotted key: value} layer; nothing it does not know passes through
unannounced: an unknown key is left for the schema check, which names the closest valid keys.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rlkit.errors import UserError


class Kind(str, Enum):
    IMPLEMENTED = "implemented"
    MAPPED = "mapped"
    REFUSED = "refused"


#: what a `mapped` rule's function returns: the rlkit keys to set and the notice ('': the rule's `why`)
Mapping_ = tuple[dict[str, Any], str]


def falsy(value: Any) -> bool:
    """The values with which a verl feature is off: null, false, 0, '', empty list/dict, 'disabled'/'none'."""
    if isinstance(value, str):
        return value.strip().lower() in ("", "none", "null", "disabled", "false", "off")
    return not value


@dataclass(frozen=True)
class VerlKey:
    """One rule. `pattern`: a dotted key where `*` is one segment, `**` any number (>= 1) of segments and
    `{a,b}` one of the listed names. `why` is the notice (mapped) or the reason and fix (refused)."""

    pattern: str
    kind: Kind
    why: str
    target: str | None = None  # alias/mapped: the rlkit key that receives the value (`{1}` = the first `*`)
    convert: Callable[[Any], Any] | None = None  # alias/mapped: verl value -> rlkit value
    derive: Callable[[Any, str], Mapping_] | None = None  # mapped: (value, key) -> (rlkit keys, notice)
    inert: Callable[[Any], bool] = falsy  # refused: values accepted as asking for nothing
    switch: str | None = None  # refused group: the sibling key (relative to the group) that turns it on
    when: Callable[[Any], bool] | None = None  # a key rlkit's schema holds too: the values this rule reads
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", _compile(self.pattern))

    @property
    def is_alias(self) -> bool:
        return self.kind is Kind.IMPLEMENTED


def _compile(pattern: str) -> re.Pattern:
    parts = []
    for seg in pattern.split("."):
        if seg == "**":
            parts.append(r"([^.]+(?:\.[^.]+)*)")
        elif seg == "*":
            parts.append(r"([^.]+)")
        elif seg.startswith("{") and seg.endswith("}"):
            parts.append("(" + "|".join(re.escape(s) for s in seg[1:-1].split(",")) + ")")
        elif "*" in seg:  # a wildcard inside a name: muon_*
            parts.append("[^.]*".join(re.escape(s) for s in seg.split("*")))
        else:
            parts.append(re.escape(seg))
    return re.compile(r"\.".join(parts) + r"\Z")


# ----------------------------------------------------------------------------------------- rule makers
def alias(pattern: str, target: str, convert: Callable[[Any], Any] | None = None, why: str = "") -> VerlKey:
    """Implemented: the same setting under rlkit's name `target`."""
    return VerlKey(pattern, Kind.IMPLEMENTED, why or f"= {target}", target=target, convert=convert)


def mapped(pattern: str, why: str, target: str | None = None, convert: Callable[[Any], Any] | None = None,
           derive: Callable[[Any, str], Mapping_] | None = None, when: Callable[[Any], bool] | None = None) -> VerlKey:
    """Mapped: `target` (or what `derive` returns) is set, and `why` is said once at start-up.
    Neither: the setting has nothing to set in rlkit (`why` says why that is the same run)."""
    return VerlKey(pattern, Kind.MAPPED, why, target=target, convert=convert, derive=derive, when=when)


def refused(pattern: str, why: str, inert: Callable[[Any], bool] = falsy, switch: str | None = None,
            when: Callable[[Any], bool] | None = None) -> VerlKey:
    """Refused unless `inert(value)`; with `switch`, every key of the group is inert while the switch is off."""
    return VerlKey(pattern, Kind.REFUSED, why, inert=inert, switch=switch, when=when)


def only(*values: Any) -> Callable[[Any], bool]:
    """An `inert` test: the value is one of these (strings compared case-insensitively) or null."""
    norm = {str(v).lower() for v in values}
    return lambda value: value is None or str(value).lower() in norm


# ----------------------------------------------------------------------------------------- matching
@dataclass
class Translation:
    """A layer in rlkit's keys: `values` to set, `notices` to show (one line each), `dropped` verl keys."""

    values: dict[str, Any] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def find_rule(key: str, rules: Iterable[VerlKey]) -> tuple[VerlKey, re.Match] | None:
    for rule in rules:
        m = rule.regex.match(key)
        if m:
            return rule, m
    return None


def _fill(target: str, m: re.Match) -> str:
    return re.sub(r"\{(\d)\}", lambda g: m.group(int(g.group(1))), target)


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _switch_on(rule: VerlKey, m: re.Match, layer: Mapping[str, Any]) -> tuple[str, Any] | None:
    """For a group rule (`prefix.**` with a switch): the switch key and its value when it is on (else None)."""
    if rule.switch is None:
        return None
    group = m.string[: m.start(m.lastindex) - 1]  # the key up to what `**` matched
    switch_key = f"{group}.{rule.switch}"
    value = layer.get(switch_key)
    return (switch_key, value) if not falsy(value) else None


def translate(layer: Mapping[str, Any], rules: Iterable[VerlKey], is_rlkit_key: Callable[[str], bool],
              source: str) -> Translation:
    """The verl keys of a flat layer in rlkit's terms; rlkit's own keys and unknown keys pass through."""
    rules = list(rules)
    out = Translation()
    said: set[str] = set()
    for key, value in layer.items():
        hit = find_rule(key, rules)
        if hit is not None and is_rlkit_key(key) and (hit[0].when is None or not hit[0].when(value)):
            hit = None  # rlkit's own key, and a value it reads as verl does
        if hit is None:
            out.values[key] = value
            continue
        rule, m = hit
        out.dropped.append(key)
        if rule.kind is Kind.REFUSED:
            on = _switch_on(rule, m, layer)
            if on is None and (rule.switch is not None or rule.inert(value)):
                line = f"verl key {key}={_show(value)}: accepted, nothing to change ({rule.why})"
                group = rule.pattern
                if group not in said:
                    said.add(group)
                    out.notices.append(line)
                continue
            shown = f"{on[0]}={_show(on[1])}" if on else f"{key}={_show(value)}"
            raise UserError(f"config key '{shown}' (from {source}) is not supported by rlkit: {rule.why}")
        if rule.derive is not None:
            values, notice = rule.derive(value, key)
            out.values.update(values)
            out.notices.append(f"verl key {key}={_show(value)} -> {notice or rule.why}")
            continue
        if rule.target is not None:
            try:
                out.values[_fill(rule.target, m)] = rule.convert(value) if rule.convert else value
            except UserError as exc:
                raise UserError(f"bad value for '{key}' (from {source}): {exc}") from None
        if rule.kind is Kind.MAPPED:
            out.notices.append(f"verl key {key}={_show(value)} -> {rule.why}")
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "", keep: Callable[[str], bool] = lambda k: False) -> dict:
    """{dotted key: leaf}; a mapping under a key `keep` accepts stays one value (a free-form dict)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and not keep(key):
            out.update(flatten(v, key + ".", keep))
        else:
            out[key] = v
    return out


def unflatten(flat: Mapping[str, Any]) -> dict:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        node[parts[-1]] = value
    return out
