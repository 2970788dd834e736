"""verl's keys of the user's config layers and command line read in rlkit's terms (rlkit.config.verl_keys).

`compose_config` (load.py) hands each layer through `VerlReader` before Hydra composes: a verl key is
aliased, mapped (one notice line) or refused (one error line) as its rule says; rlkit's own keys and
unknown keys pass through untouched (the schema check names the closest valid keys for the latter).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rlkit.config.verl_rules import VerlKey, find_rule, flatten, translate, unflatten

CLI = "command line"  # where a value on the command line came from, in error lines


def is_known(dotted: str, known: set[str], mappings: Sequence[str]) -> bool:
    """Whether the schema holds `dotted`: a leaf key, or an entry under one of its free-form mappings."""
    return dotted in known or any(dotted.startswith(m + ".") for m in mappings)


class VerlReader:
    """verl's keys of the user's layers in rlkit's terms, and the notices that says."""

    def __init__(self, known: set[str], mappings: Sequence[str], rules: Sequence[VerlKey]) -> None:
        self.known = known
        self.mappings = list(mappings)
        self.rules = rules
        self.notices: list[str] = []

    def is_rlkit(self, key: str) -> bool:
        return is_known(key, self.known, self.mappings)

    def keep_whole(self, key: str) -> bool:
        """A free-form mapping of rlkit's stays one value when a layer is flattened."""
        return key in self.mappings

    def claims(self, key: str, value: Any) -> bool:
        """Whether a rule reads this key (a verl key; or rlkit's own key with a value spelled as verl does)."""
        hit = find_rule(key, self.rules)
        return hit is not None and (not self.is_rlkit(key) or (hit[0].when is not None and hit[0].when(value)))

    def layer(self, tree: dict, source: str) -> dict:
        """A nested layer with its verl keys translated (a refused one raises, naming `source`)."""
        flat = flatten(tree, keep=self.keep_whole)
        if not any(self.claims(k, v) for k, v in flat.items()):
            return tree
        done = translate(flat, self.rules, self.is_rlkit, source)
        self.say(done.notices)
        return unflatten(done.values)

    def say(self, notices: Iterable[str]) -> None:
        """Add lines; a key said again (a user layer, then the composed config) keeps one line, the latest."""
        for line in notices:
            said = [i for i, n in enumerate(self.notices) if _about(n) == _about(line)]
            if said:
                self.notices[said[0]] = line
            else:
                self.notices.append(line)


def _about(line: str) -> str:
    """The key a `verl key KEY=VALUE ...` line is about (the whole line for any other line)."""
    return line.split("=", 1)[0] if line.startswith("verl key ") else line


def hydra_literal(value: Any) -> str:
    """A Python value written in Hydra's override grammar (quoted strings, [lists], {dicts}, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_literal(v)}" for k, v in value.items()) + "}"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def translate_overrides(parsed: list[Any], verl: VerlReader) -> list[Any]:
    """The command line's verl keys as rlkit overrides (`++key=value`), the rest as given."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out, parser = [], OverridesParser.create()
    for o in parsed:
        key = o.key_or_group
        if not key or o.is_delete() or not verl.claims(key, o.value()):
            if o.is_delete() and key and not verl.is_rlkit(key) and find_rule(key, verl.rules):
                continue  # `~verl_key`: back to verl's default, which asks nothing of rlkit
            out.append(o)
            continue
        done = translate({key: o.value()}, verl.rules, verl.is_rlkit, f"{CLI} '{o.input_line}'")
        verl.say(done.notices)
        out += [parser.parse_override(f"++{k}={hydra_literal(v)}") for k, v in done.values.items()]
    return out
