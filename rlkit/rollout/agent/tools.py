"""Tools the model can call between turns: base class, registry, and a safe runner.

A tool is a class registered in `TOOLS` with an OpenAI-style function schema
(`name`, `description`, JSON-schema `parameters`); `schema()` is what the chat
template receives as `tools=[...]`. The agent loop builds one instance per tool
named in `multi_turn.tools` (constructor kwargs from `multi_turn.tool_config`)
and calls `call(arguments, **tools_kwargs[name])` with the per-sample kwargs
from the dataset's `tools_kwargs` column.

`call` may be `async def` (awaited) or a plain function (run in a thread).
`run_tool` never raises: an exception, a timeout or bad arguments become a
`ToolResult` with `error` set, whose text is shown to the model.

Stateful tools (`stateful = True`: a notepad, a REPL, a browser, a game) get one instance per
episode: the loop calls `episode()` at the episode's first call of the tool (a copy of the
configured instance, `reset()` to a fresh state), routes every later call of that episode to it,
and calls `release()` once when the episode ends, however it ends. Stateless tools are one instance
shared by every episode.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

from rlkit.registry import Registry

_BUILTIN_MODULES = ("rlkit.rollout.agent.builtin_tools", "rlkit.rollout.agent.search_tool")


@dataclass
class ToolResult:
    """What the model sees (`text`) and, when the call failed, why (`error`: a short kind)."""

    text: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Tool:
    """Subclass, set `name`/`description`/`parameters`, implement `call`, register in `TOOLS`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}, "required": []}

    shown_schema: dict[str, Any] | None = None  # set by `with_schema`: the schema the model sees instead

    def __init__(self, **config: Any) -> None:
        if config:
            raise TypeError(f"tool '{self.name}' takes no config, got {sorted(config)}")

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema passed to the chat template."""
        if self.shown_schema is not None:
            return self.shown_schema
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def with_schema(self, schema: dict[str, Any]) -> Tool:
        """A copy shown to the model under another schema (a verl tool-config's `tool_schema`: its function name,
        description and parameters); the calls still run this tool's `call`."""
        shown = copy.copy(self)
        shown.shown_schema = schema
        return shown

    @property
    def function_name(self) -> str:
        """The name the model calls this tool by."""
        return str(self.schema()["function"]["name"])

    def call(self, arguments: dict[str, Any], **kwargs: Any) -> str | ToolResult:  # pragma: no cover - abstract
        raise NotImplementedError

    stateful: ClassVar[bool] = False  # True: each episode calls its own instance (episode / reset / release)

    def episode(self) -> Tool:
        """The instance one episode calls: for a stateful tool a copy of this configured one, reset to a fresh
        state; a stateless tool is shared."""
        if not self.stateful:
            return self
        instance = copy.copy(self)
        instance.reset()
        return instance

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Set up a fresh per-episode state (stateful tools)."""

    def release(self) -> None:  # noqa: B027 - optional hook; may also be `async def`
        """Free what the episode's instance holds; called once when the episode ends, also after errors."""


TOOLS: Registry[type[Tool]] = Registry("tool")


def load_builtin_tools() -> Registry[type[Tool]]:
    """Import the built-in tool modules so their `@TOOLS.register` has run."""
    for name in _BUILTIN_MODULES:
        importlib.import_module(name)
    return TOOLS


def build_tools(names: list[str], config: dict[str, dict[str, Any]] | None = None) -> dict[str, Tool]:
    """Instances of the named tools; `config[name]` are constructor kwargs."""
    load_builtin_tools()
    config = config or {}
    return {name: TOOLS.get(name)(**dict(config.get(name) or {})) for name in names}


def _missing_required(tool: Tool, arguments: dict[str, Any]) -> list[str]:
    parameters = tool.schema()["function"].get("parameters")
    required = parameters.get("required", []) if isinstance(parameters, dict) else []
    return [k for k in required if k not in arguments]


async def run_tool(tool: Tool, arguments: Any, kwargs: dict[str, Any] | None, timeout_s: float) -> ToolResult:
    """Call `tool` with a timeout; every failure becomes an error result (never raises)."""
    if not isinstance(arguments, dict):
        return ToolResult(f"Error: arguments for '{tool.function_name}' must be a JSON object", "bad_arguments")
    missing = _missing_required(tool, arguments)
    if missing:
        return ToolResult(f"Error: '{tool.function_name}' is missing required argument(s): {', '.join(missing)}",
                          "bad_arguments")
    kwargs = dict(kwargs or {})
    try:
        if inspect.iscoroutinefunction(tool.call):
            out = await asyncio.wait_for(tool.call(arguments, **kwargs), timeout_s)
        else:
            out = await asyncio.wait_for(asyncio.to_thread(tool.call, arguments, **kwargs), timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        return ToolResult(f"Error: '{tool.function_name}' timed out after {timeout_s:g}s", "timeout")
    except Exception as exc:  # a tool bug must not crash the rollout
        return ToolResult(f"Error: {type(exc).__name__}: {exc}", "exception")
    if isinstance(out, ToolResult):
        return out
    return ToolResult(str(out))


async def release_tool(tool: Tool) -> str | None:
    """`tool.release()`, awaited if async; never raises: returns the error text instead."""
    try:
        out = tool.release()
        if inspect.isawaitable(out):
            await out
    except Exception as exc:  # a tool's cleanup bug must not fail the rollout
        return f"{type(exc).__name__}: {exc}"
    return None
