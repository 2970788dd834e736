"""What a trained role's checkpoint holds and what a resume loads (verl's `<role>.checkpoint.save_contents` /
`load_contents`): `model` (the weights: always), `optimizer` (its state), `extra` (the LR schedule's position).

Leaving `optimizer` or `extra` out of `load_contents` resumes with a fresh optimizer state or schedule, as verl does;
leaving them out of `save_contents` makes smaller checkpoints that can only be resumed that way. verl's `hf_model`
(an HF copy of the weights next to the checkpoint) is `rlkit export CKPT` here (the verl-key rule says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.errors import UserError

CONTENTS = ("model", "optimizer", "extra")


def _all() -> list:
    return list(CONTENTS)


@dataclass
class CheckpointContents:
    save_contents: list = field(default_factory=_all, metadata={"help": "what each checkpoint of this role holds: "
                                "model (always), optimizer (its state), extra (the LR schedule)"})
    load_contents: list | None = field(default=None, metadata={"help": "what a resume loads (a subset of what was "
                                       "saved); the rest starts fresh. null = save_contents"})


def settle_contents(ckpt: CheckpointContents, prefix: str) -> None:
    """Lists of known names, `model` in both (a checkpoint without the weights resumes nothing), load <= save."""
    ckpt.save_contents = _names(ckpt.save_contents, f"{prefix}.save_contents")
    ckpt.load_contents = _names(ckpt.load_contents, f"{prefix}.load_contents") if ckpt.load_contents is not None \
        else list(ckpt.save_contents)
    missing = sorted(set(ckpt.load_contents) - set(ckpt.save_contents))
    if missing:
        raise UserError(f"{prefix}.load_contents names {', '.join(missing)}, which {prefix}.save_contents="
                        f"{ckpt.save_contents} does not save; drop it from load_contents or add it to save_contents")


def _names(value: Any, key: str) -> list[str]:
    names = [value] if isinstance(value, str) else [str(v) for v in value or []]
    unknown = sorted(set(names) - set(CONTENTS))
    if unknown:
        raise UserError(f"{key}: unknown content {unknown[0]!r}; use a list of {list(CONTENTS)}")
    if "model" not in names:
        raise UserError(f"{key}={names} leaves out the model: rlkit's checkpoints always hold the weights; add model")
    return [n for n in CONTENTS if n in names]
