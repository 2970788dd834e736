"""Built-in tools: `calculator` (safe arithmetic, parsed with `ast`, never `eval`), `python`
(runs a program in the reward sandbox and returns its output) and `notepad` (per-episode notes:
the built-in example of a stateful tool)."""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import re
from dataclasses import replace
from typing import Any

from rlkit.rollout.agent.tools import TOOLS, Tool, ToolResult
from rlkit.sandbox import SandboxLimits, run_program

MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e300
MAX_EXPRESSION_CHARS = 500
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # 1,000 -> 1000 (not the comma of max(1, 2))

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitXor: operator.pow,  # calculators write 2^10 for a power
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}


class CalculatorError(ValueError):
    pass


def _check(value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalculatorError("the result is not a real number")
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("result is too large")
    return value


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if type(node.op) in (ast.Pow, ast.BitXor) and (abs(right) > MAX_EXPONENT or abs(left) > MAX_MAGNITUDE):
            raise CalculatorError("exponent is too large")
        if type(node.op) in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
            raise CalculatorError("division by zero")
        return _check(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords or not node.args:
            raise CalculatorError(f"{node.func.id}() takes positional numbers")
        args = [_eval(a) for a in node.args]
        try:
            return _check(_FUNCTIONS[node.func.id](*args))
        except (TypeError, ValueError) as exc:
            raise CalculatorError(f"{node.func.id}(): {exc}") from None
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def format_number(value: float | int) -> str:
    """Integers as integers (4.0 -> "4"), other floats with up to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def calculate(expression: str) -> str:
    """Evaluate arithmetic: + - * / // % ** (or ^), parentheses, abs/round/min/max/sqrt."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = _THOUSANDS.sub("", expression.strip()).replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r}") from None
    try:
        return format_number(_eval(tree))
    except (OverflowError, ZeroDivisionError):
        raise CalculatorError("result is too large or undefined") from None


@TOOLS.register("calculator")
class Calculator(Tool):
    name = "calculator"
    description = "Evaluate an arithmetic expression, e.g. (12 + 30) * 4 / 3. Supports + - * / // % ** and sqrt."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "the arithmetic expression"}},
        "required": ["expression"],
    }

    async def call(self, arguments: dict[str, Any], **kwargs: Any) -> ToolResult:
        try:
            return ToolResult(calculate(arguments["expression"]))
        except CalculatorError as exc:
            return ToolResult(f"Error: {exc}", "calculator_error")


@TOOLS.register("python")
class PythonTool(Tool):
    """Runs `code` in the sandbox (time, memory, output limits; no network where the OS allows).

    Per-sample kwargs (dataset `tools_kwargs: {python: {...}}`): `preamble` is code run
    before the model's (e.g. the problem's helper functions).
    """

    name = "python"
    description = "Run a Python 3 program and return what it prints (stdout and stderr). State is not kept."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a complete Python program; print the results"}},
        "required": ["code"],
    }

    def __init__(self, wall_s: float = 5.0, memory_mb: int = 512, output_bytes: int = 1 << 16) -> None:
        self.limits = replace(SandboxLimits(), wall_s=wall_s, memory_mb=memory_mb, output_bytes=output_bytes)

    async def call(self, arguments: dict[str, Any], preamble: str = "", **_: Any) -> ToolResult:
        code = arguments["code"]
        if not isinstance(code, str):
            return ToolResult("Error: 'code' must be a string", "bad_arguments")
        program = f"{preamble}\n{code}" if preamble else code
        res = await asyncio.to_thread(run_program, program, None, self.limits)
        parts = []
        if res.stdout:
            parts.append(res.stdout.rstrip("\n"))
        if res.stderr:
            parts.append("stderr:\n" + res.stderr.rstrip("\n"))
        if res.status != "ok":
            parts.append(f"[{res.status}]")
        text = "\n".join(parts) if parts else "(no output)"
        return ToolResult(text, None if res.ok else res.status)


@TOOLS.register("notepad")
class Notepad(Tool):
    """Notes that last for one episode: `write` keeps a line, `read` returns the lines so far. Each episode
    has its own pad (a stateful tool), so concurrent episodes never see each other's notes."""

    name = "notepad"
    description = "Keep notes during this task: action 'write' saves the text, action 'read' returns every note."
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["write", "read"]},
            "text": {"type": "string", "description": "the note to save (for write)"},
        },
        "required": ["action"],
    }
    stateful = True

    def __init__(self, max_notes: int = 32) -> None:
        self.max_notes = max_notes
        self.notes: list[str] | None = None  # None: the configured template, not an episode's instance

    def reset(self) -> None:
        self.notes = []

    def release(self) -> None:
        self.notes = None

    def call(self, arguments: dict[str, Any], **kwargs: Any) -> ToolResult:
        if self.notes is None:
            raise RuntimeError("notepad called outside an episode (the loop calls each episode's own instance)")
        action = arguments.get("action")
        if action == "read":
            return ToolResult("\n".join(f"{i + 1}. {note}" for i, note in enumerate(self.notes)) or "(no notes yet)")
        if action != "write":
            return ToolResult(f"Error: unknown action {action!r}; use 'write' or 'read'", "bad_arguments")
        if len(self.notes) >= self.max_notes:
            return ToolResult(f"Error: the notepad holds at most {self.max_notes} notes", "full")
        self.notes.append(str(arguments.get("text", "")))
        return ToolResult(f"saved note {len(self.notes)}")


@TOOLS.register("gsm8k_answer")
class GSM8KAnswer(Tool):
    """The model submits its final answer and is told whether it is right (verl's gsm8k tool does the same):
    the row's `ground_truth` comes from `tools_kwargs` (verl's data: `{create_kwargs: {ground_truth: ..}}`).
    Scored as the `gsm8k` scorer's `flexible` method does (the last number of the answer)."""

    name = "gsm8k_answer"
    description = "Submit your final answer to the math problem; the reply says if it is correct (1.0) or not (0.0)."
    parameters = {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "the final answer, a number"}},
        "required": ["answer"],
    }

    def call(self, arguments: dict[str, Any], ground_truth: Any = None, **_: Any) -> ToolResult:
        from rlkit.reward.gsm8k import gsm8k_score

        if ground_truth is None:
            return ToolResult("Error: this problem has no ground truth (tools_kwargs has none)", "no_ground_truth")
        answer = str(arguments["answer"]).strip()
        response = answer if answer.startswith("####") else f"#### {answer}"
        reward = gsm8k_score(response, ground_truth, method="flexible")["score"]
        return ToolResult(f"answer {answer!r}: reward {reward:g}")


@TOOLS.register("math_answer")
class MathAnswer(Tool):
    """The model submits a final math answer (an expression, not a whole solution) and is told whether it is right:
    compared with the row's `ground_truth` (from `tools_kwargs`) by the `math` scorer's symbolic equivalence.
    verl's Geo3k tool maps here (it grades the submitted answer as given, without a `\\boxed{}`)."""

    name = "math_answer"
    description = "Submit your final answer to the math problem; the reply says if it is correct (1.0) or not (0.0)."
    parameters = {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "the final answer, e.g. 3\\sqrt{2} or 12"}},
        "required": ["answer"],
    }

    def call(self, arguments: dict[str, Any], ground_truth: Any = None, **_: Any) -> ToolResult:
        from rlkit.reward.math_equiv import math_score

        if ground_truth is None:
            return ToolResult("Error: this problem has no ground truth (tools_kwargs has none)", "no_ground_truth")
        answer = str(arguments["answer"]).strip()
        reward = math_score(f"\\boxed{{{answer}}}", ground_truth)["acc"]
        return ToolResult(f"answer {answer!r}: reward {reward:g}")
