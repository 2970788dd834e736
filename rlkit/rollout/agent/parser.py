"""Tool-call parsers: model text of one turn -> (content, tool calls). Pluggable via `TOOL_PARSERS`.

`hermes` reads the common format (Qwen, Hermes, many others):

    <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>

Several calls in one turn are allowed. A call whose JSON does not parse, has no
name, or is left open (no closing marker) is returned with `error` set, so the
loop can tell the model what was wrong instead of silently ending the episode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlkit.registry import Registry


@dataclass
class ToolCall:
    name: str
    arguments: Any = field(default_factory=dict)
    error: str | None = None  # why the call could not be parsed (the call is then not run)


@dataclass
class ParsedTurn:
    content: str  # the text without the tool calls
    calls: list[ToolCall] = field(default_factory=list)


class ToolParser:
    """Subclasses set the markers and implement `parse`; `end_marker` may serve as a stop token."""

    start_marker: str = ""
    end_marker: str = ""

    def parse(self, text: str) -> ParsedTurn:  # pragma: no cover - abstract
        raise NotImplementedError

    def instructions(self, schemas: list[dict[str, Any]]) -> str:
        """How to call the tools, for chat templates that ignore `tools=` (added to the system message)."""
        lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
        return (
            "# Tools\n\nYou may call the functions below to help with the task. Their JSON schemas:\n"
            f"<tools>\n{lines}\n</tools>\n\nTo call one, write\n{self.start_marker}"
            '{"name": <function name>, "arguments": <JSON object of arguments>}'
            f"{self.end_marker}\nand stop; the result comes back in the next message. "
            "When you have the final answer, reply without a function call."
        )

    def end_token_id(self, tokenizer: Any) -> int | None:
        """The id of `end_marker` when it is a single token of this tokenizer, else None."""
        if not self.end_marker:
            return None
        ids = tokenizer.encode(self.end_marker, add_special_tokens=False)
        return int(ids[0]) if len(ids) == 1 else None


TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool-call format")


def _strip_keys(value: Any) -> Any:
    """Keys with surrounding spaces (word-level tokenizers decode `" name "`) are normalised."""
    if isinstance(value, dict):
        return {k.strip() if isinstance(k, str) else k: _strip_keys(v) for k, v in value.items()}
    return value


@TOOL_PARSERS.register("hermes", "tool_call", "qwen", "qwen25")
class HermesParser(ToolParser):
    """`<tool_call>{"name", "arguments"}</tool_call>`: Hermes's and Qwen2.5/3's format (SGLang's parser names for
    the latter, `qwen` and `qwen25`, which verl's sglang scripts pass as `multi_turn.format`)."""

    start_marker = "<tool_call>"
    end_marker = "</tool_call>"

    def __init__(self) -> None:
        s, e = re.escape(self.start_marker), re.escape(self.end_marker)
        self._closed = re.compile(f"{s}(.*?){e}", re.DOTALL)
        self._open = re.compile(f"{s}(.*)$", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        calls = [self._call(body) for body in self._closed.findall(text)]
        content = self._closed.sub("", text)
        dangling = self._open.search(content)
        if dangling is not None:
            calls.append(ToolCall("", {}, f"tool call not closed with {self.end_marker}"))
            content = content[: dangling.start()]
        return ParsedTurn(content.strip(), calls)

    @staticmethod
    def _call(body: str) -> ToolCall:
        body = body.strip()
        if body.startswith("```"):
            body = body.strip("`").removeprefix("json").strip()
        try:
            obj = _strip_keys(json.loads(body))
        except ValueError as exc:
            return ToolCall("", {}, f"tool call is not valid JSON ({exc.args[0] if exc.args else exc})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
            return ToolCall("", {}, 'tool call needs {"name": ..., "arguments": {...}}')
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # OpenAI style: arguments as a JSON string
            try:
                args = _strip_keys(json.loads(args)) if args.strip() else {}
            except ValueError:
                return ToolCall(obj["name"].strip(), args, "arguments are not valid JSON")
        return ToolCall(obj["name"].strip(), args if args is not None else {})


@TOOL_PARSERS.register("gpt-oss")
class GptOssParser(ToolParser):
    """gpt-oss's harmony format: a call is a `commentary` message addressed to the function,

        <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"arg": ...}<|call|>

    (after `<|start|>assistant` when the turn wrote an analysis message first). Analysis messages (the model's
    reasoning) are dropped before parsing, so a call drafted inside them is not run. The turn ends at `<|call|>`,
    which the template defines as a stop token."""

    start_marker = "<|channel|>commentary to=functions."
    end_marker = "<|call|>"
    _analysis = re.compile(r"<\|channel\|>analysis<\|message\|>.*?(?:<\|end\|>|$)", re.DOTALL)
    _call = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>[^<]*?to=functions\.([^\s<]+)\s*"
                       r"(?:<\|constrain\|>\s*json\s*)?<\|message\|>(.*?)<\|call\|>", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        text = self._analysis.sub("", text)
        calls = []
        for name, body in self._call.findall(text):
            try:
                arguments = _strip_keys(json.loads(body)) if body.strip() else {}
            except ValueError as exc:
                calls.append(ToolCall(name, {}, f"tool call arguments are not valid JSON ({exc})"))
                continue
            calls.append(ToolCall(name, arguments))
        content = self._call.sub("", text)
        for marker in ("<|start|>assistant", "<|channel|>final<|message|>", "<|end|>", "<|return|>"):
            content = content.replace(marker, "")
        return ParsedTurn(content.strip(), calls)
