"""Generate the config reference (docs/config.md) from the schema, so it cannot drift.

Run: `python -m rlkit.trainer.config_doc > docs/config.md` (a test checks the file is current).
"""

from __future__ import annotations

import dataclasses

from rlkit.trainer.config_schema import RLConfig


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


def render() -> str:
    out = [
        "# Config reference",
        "",
        "Generated from `rlkit/trainer/config_schema.py` by `python -m rlkit.trainer.config_doc`; do not edit.",
        "Set any key on the command line: `rlkit train grpo data.train_batch_size=32 actor_rollout_ref.rollout.n=8`.",
        "Presets (`rlkit train <preset>`) change a few of these defaults; `--dry-run` prints the resolved config.",
        "",
    ]
    from rlkit.trainer.registered_names import registered_names  # names come from the registries themselves

    group = None
    for key, default, help_text in _rows(RLConfig):
        names = registered_names(key, builtin_only=True)
        if names is not None:
            help_text = f"{help_text}; registered: {', '.join(names)}"
        top = key.split(".")[0] if not key.startswith("actor_rollout_ref") else ".".join(key.split(".")[:2])
        if top != group:
            group = top
            out += ["", f"## `{group}`", "", "| key | default | meaning |", "|---|---|---|"]
        out.append(f"| `{key}` | `{default}` | {help_text.replace('|', '/')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
