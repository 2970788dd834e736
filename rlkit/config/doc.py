"""Generate the config reference (docs/config.md) from the schema, so it cannot drift.

`render(names_of)` takes the registered names of registry-valued keys from the caller (the
config layer imports no registry). Run: `python -m rlkit.trainer.run.run_config > docs/config.md`
(a test checks the file is current).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlkit.config.schema import REMOVED_KEYS, RLConfig


def _rows(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    rows = []
    instance = cls()
    for fld in dataclasses.fields(cls):
        value = getattr(instance, fld.name)
        key = prefix + fld.name
        if dataclasses.is_dataclass(value):
            rows.extend(_rows(type(value), key + "."))
            continue
        help_text = fld.metadata.get("help", "")
        if not help_text:
            help_text = _inline_help(cls, fld.name)
        rows.append((key, repr(value) if not isinstance(value, str) else f'"{value}"', help_text))
    return rows


def _inline_help(cls: type, name: str) -> str:
    """Fields without `help` metadata (e.g. the rollout config) carry a trailing `# comment` in the source."""
    import inspect

    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(f"{name}:") and "#" in stripped:
            return stripped.split("#", 1)[1].strip()
    return ""


def render(names_of: Callable[[str], list[str] | None] = lambda key: None) -> str:
    """The reference page; `names_of(key)` lists the names a registry-valued key accepts (None: not one)."""
    out = [
        "# Config reference",
        "",
        "Generated from `rlkit/config/schema.py` by `python -m rlkit.trainer.run.run_config`; do not edit.",
        "Set any key on the command line: `rlkit train grpo data.train_batch_size=32 actor_rollout_ref.rollout.n=8`",
        "(Hydra's override grammar: `+key=v`, `++key=v`, `~key`, `[a,b]`, `${interpolation}`; README.md, Config).",
        "Presets (`rlkit train <preset>`, the Hydra group `algorithm`) change a few of these defaults;",
        "`--dry-run` prints the resolved config.",
        "",
    ]
    group = None
    for key, default, help_text in _rows(RLConfig):
        names = names_of(key)
        if names is not None:
            help_text = f"{help_text}; registered: {', '.join(names)}"
        top = key.split(".")[0] if not key.startswith("actor_rollout_ref") else ".".join(key.split(".")[:2])
        if top != group:
            group = top
            out += ["", f"## `{group}`", "", "| key | default | meaning |", "|---|---|---|"]
        out.append(f"| `{key}` | `{default}` | {help_text.replace('|', '/')} |")
    out += ["", "## Removed keys", "", "Naming one of these is an error that says what to do instead.", "",
            "| key | why |", "|---|---|"]
    out += [f"| `{key}` | {why} |" for key, why in sorted(REMOVED_KEYS.items())]
    return "\n".join(out) + "\n"

