"""`ScriptedEngine`: a deterministic fake engine for the agent loop tests (no model).

Sample i, turn t answers with `scripts[i][t]` (text in the tiny tokenizer's vocabulary),
tokenised and followed by EOS, cut at the first stop token or at the request's budget,
exactly as a real engine would. Log-prob of the k-th token of a turn: -(k + 1) / 100.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rlkit.rollout.agent.engine import TurnOutput, TurnRequest
from rlkit.rollout.agent.tools import Tool, ToolResult
from rlkit.testing import build_tiny_tokenizer


def call(name: str, **arguments: str) -> str:
    """A hermes tool call spelled with spaces, so the word-level tiny tokenizer keeps every piece."""
    args = " , ".join(f'" {k} " : " {v} "' for k, v in arguments.items())
    return f'<tool_call> {{ " name " : " {name} " , " arguments " : {{ {args} }} }} </tool_call>'


class ScriptedEngine:
    def __init__(self, tokenizer: Any, scripts: dict[int, list[str]], default: str = "the answer is 0",
                 extra_stop_ids: list[int] | None = None, delay_s: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.default = default
        self.stop_ids = [tokenizer.eos_token_id, *(extra_stop_ids or [])]
        self.delay_s = delay_s
        self.requests: list[TurnRequest] = []
        self.outputs: dict[int, list[list[int]]] = {}
        self.active = 0
        self.max_active = 0

    @contextlib.asynccontextmanager
    async def session(self):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            yield
        finally:
            self.active -= 1

    def planned_ids(self, sample: int, turn: int) -> list[int]:
        turns = self.scripts.get(sample, [])
        text = turns[turn] if turn < len(turns) else self.default
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    async def generate(self, request: TurnRequest) -> TurnOutput:
        self.requests.append(request)
        await asyncio.sleep(self.delay_s)
        ids = self.planned_ids(request.sample_index, request.turn)
        stop_at = next((k for k, t in enumerate(ids) if t in self.stop_ids), len(ids) - 1)
        ids = ids[: stop_at + 1]
        out = ids[: request.max_tokens]
        self.outputs.setdefault(request.sample_index, []).append(out)
        return TurnOutput(out, [-(k + 1) / 100 for k in range(len(out))], stopped=len(out) == len(ids))


class SlowTool(Tool):
    """Sleeps `seconds`, then answers "1"; records how many calls overlap."""

    name = "reverse"
    parameters = {"type": "object", "properties": {}, "required": []}

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds
        self.running = 0
        self.max_running = 0
        self.calls = 0
        self.kwargs: list[dict] = []

    async def call(self, arguments: dict, **kwargs: Any) -> ToolResult:
        self.calls += 1
        self.kwargs.append(kwargs)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.running -= 1
        return ToolResult("1")


class BrokenTool(Tool):
    name = "think"

    def call(self, arguments: dict, **kwargs: Any) -> str:  # a plain function: runs in a thread
        raise RuntimeError("boom")


class StuckTool(Tool):
    name = "step"

    async def call(self, arguments: dict, **kwargs: Any) -> str:
        await asyncio.sleep(30)
        return "never"


def tiny_tokenizer():
    return build_tiny_tokenizer()
