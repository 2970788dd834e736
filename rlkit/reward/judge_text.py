"""The generative judge's text side: the prompt template it fills and the parsers that turn a verdict into a score.

Why a module of its own: both are pure string functions, tested without any model, and shared by every
judge backend (rlkit.reward.judge_backends). The judge itself is rlkit.reward.llm_judge.

Template: `{prompt}`, `{response}` and `{ground_truth}` are replaced; `{{` and `}}` are literal braces;
any other `{identifier}` is a UserError (a typo such as `{respones}` would otherwise reach the judge
silently); other brace text (`{"score": 7}` in an instruction) stays as written.

Parsers (`JUDGE_PARSERS`, or a user's 'file.py:function'): `parser(text) -> float | None`; None (or a
ValueError) means no score was found, which costs the sample 0 and a counted error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from rlkit.config.judge import PREFIX
from rlkit.errors import UserError
from rlkit.registry import Registry

Parser = Callable[[str], "float | None"]
JUDGE_PARSERS: Registry[Parser] = Registry(f"judge parser ({PREFIX}parser)")

PLACEHOLDERS = ("prompt", "response", "ground_truth")
NO_GROUND_TRUTH = "(none given)"

DEFAULT_TEMPLATE = """You are grading an assistant's response to a task.

[Task]
{prompt}

[Reference answer]
{ground_truth}

[Response]
{response}

Judge correctness against the reference answer (when one is given) first, then helpfulness and clarity.
Write one or two sentences of justification, then end with a line "Score: N", where N is an integer
from 0 (wrong or useless) to 10 (fully correct and helpful)."""

_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


class JudgeTemplate:
    """A checked template; `render(prompt, response, ground_truth)` fills it."""

    def __init__(self, text: str, source: str = f"{PREFIX}template") -> None:
        names = {m.group(1) for m in _FIELD.finditer(text) if m.group(1)}
        unknown = sorted(names - set(PLACEHOLDERS))
        if unknown:
            raise UserError(
                f"{source}: unknown placeholder {', '.join('{' + n + '}' for n in unknown)}; use "
                f"{', '.join('{' + n + '}' for n in PLACEHOLDERS)} (write {{{{ and }}}} for literal braces)"
            )
        if "response" not in names:
            raise UserError(f"{source}: the template has no {{response}}; the judge would not see what it scores")
        self.text = text

    @classmethod
    def from_config(cls, template: str, template_path: str | None) -> JudgeTemplate:
        if template_path:
            path = Path(template_path).expanduser()
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise UserError(f"{PREFIX}template_path: cannot read {path} ({exc.strerror or exc})") from None
            if not text.strip():
                raise UserError(f"{PREFIX}template_path: {path} is empty")
            return cls(text, source=f"{PREFIX}template_path ({path})")
        return cls(template or DEFAULT_TEMPLATE)

    def render(self, prompt: str, response: str, ground_truth: str | None) -> str:
        values = {
            "prompt": prompt,
            "response": response,
            "ground_truth": NO_GROUND_TRUTH if ground_truth is None else str(ground_truth),
        }

        def sub(m: re.Match[str]) -> str:
            token = m.group(0)
            return token[0] if m.group(1) is None else values[m.group(1)]

        return _FIELD.sub(sub, self.text)


def prompt_text(prompt: str | list[dict[str, str]]) -> str:
    """The text a template's {prompt} shows: a string as is; chat messages as 'role: content' lines
    (a lone user message as its content), e.g. the dataset's `raw_prompt`."""
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt)
    if len(messages) == 1 and messages[0].get("role") == "user":
        return str(messages[0].get("content", ""))
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


# ------------------------------------------------------------------ parsers
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_DENOMINATOR = re.compile(r"(?:/|\bout\s+of)\s*$", re.IGNORECASE)


@JUDGE_PARSERS.register("last_number_0_10")
def last_number_0_10(text: str) -> float | None:
    """The last number in [0, 10], divided by 10. Denominators ("7/10", "7 out of 10") and numbers
    outside the range (a year, a negative) are skipped; no such number: None."""
    for m in reversed(list(_NUMBER.finditer(text))):
        if _DENOMINATOR.search(text[: m.start()]):
            continue
        value = float(m.group(0))
        if 0.0 <= value <= 10.0:
            return value / 10.0
    return None


_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


@JUDGE_PARSERS.register("yes_no")
def yes_no(text: str) -> float | None:
    """The last standalone "yes" (1.0) or "no" (0.0), any case; neither: None. For correctness judges
    whose template asks "Is the response correct? Answer yes or no."."""
    found = _YES_NO.findall(text)
    return None if not found else float(found[-1].lower() == "yes")


def load_parser(spec: str) -> Parser:
    """A registered parser name, or 'path/to/file.py:function' loaded from the user's file."""
    if spec in JUDGE_PARSERS or ".py:" not in spec:
        return JUDGE_PARSERS.get(spec)
    from rlkit.reward.custom import load_custom_fn

    path, _, name = spec.rpartition(":")
    try:
        return load_custom_fn(path, name)
    except UserError as exc:  # its message names custom_reward_function.*; name the judge's key instead
        message = re.sub(r"^custom_reward_function\.\w+:", f"{PREFIX}parser:", str(exc))
        raise UserError(message) from None


def parse_score(parser: Parser, text: str) -> tuple[float, str | None]:
    """(score, None), or (0.0, error) when the parser finds no score, fails or returns a non-number."""
    try:
        value = parser(text)
    except ValueError as exc:
        return 0.0, f"unparsable: {exc}"
    except Exception as exc:  # a user's parser may fail in any way; the sample scores 0, the run goes on
        return 0.0, f"parser error: {type(exc).__name__}: {exc}"
    if value is None:
        return 0.0, f"unparsable: {_tail(text)!r}"
    try:
        score = float(value)
    except (TypeError, ValueError):
        return 0.0, f"parser error: returned {type(value).__name__}, not a number"
    if not math.isfinite(score):
        return 0.0, f"parser error: returned {score}"
    return score, None


def _tail(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "..." + text[-limit:]
