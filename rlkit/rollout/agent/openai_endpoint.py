"""An OpenAI-compatible chat endpoint over the rollout engine, for agent frameworks that speak the OpenAI API.

With `multi_turn.external_agent=NAME` the agent loop does not drive the episodes itself: it starts this
endpoint on 127.0.0.1 (a free port) for the rollout and runs the registered agent (`EXTERNAL_AGENTS`)
once per sample, pointed at `http://127.0.0.1:PORT/episodes/<sample>/v1`. Any client that can set a
base URL works (the `openai` package, LangChain, the OpenAI Agents SDK...).

Training must use exactly the tokens the engine sampled, never a re-tokenisation of the text the
framework sends back. So the server keeps each episode's token context itself:

- the first request's messages (and `tools`) are rendered with the chat template: the episode's prompt;
- the engine's output tokens are appended as model tokens (mask 1, with their log-probs);
- a later request must repeat the conversation so far (same roles and contents, the server's own replies
  included); only its new messages are rendered, as the agent loop does (`ChatRenderer.append_ids`), and
  appended as non-model tokens (mask 0);
- a request that rewrites the history (drops or edits earlier turns) is still answered, from its own
  rendering, but ends the training trajectory at the last consistent turn (`agent/prefix_breaks`).

The response budget (`data.max_response_length`) is the episode's, as in the agent loop: `max_tokens` is
capped by what is left, and a request with nothing left gets an empty reply with finish_reason "length".
Sampling (temperature, seed) is the rollout's; request sampling fields are ignored. Replies carry the
turn's tool calls in OpenAI's `tool_calls` form (parsed by the configured `multi_turn.format`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkit.registry import Registry
from rlkit.rollout.agent.chat import ChatRenderer
from rlkit.rollout.agent.engine import AsyncEngine, TurnRequest
from rlkit.rollout.agent.parser import ToolParser

# An external agent: `await agent(base_url, messages, tools, **agent_config)` runs one episode against the
# endpoint; `messages` is the sample's prompt conversation, `tools` the rlkit tools named in multi_turn.tools.
ExternalAgent = Callable[..., Awaitable[Any]]
EXTERNAL_AGENTS: Registry[ExternalAgent] = Registry("external agent")


@dataclass
class EpisodeLog:
    """One episode's token context as the engine saw it."""

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 = sampled by the engine
    log_probs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation, the server's replies included
    last_token_text: str = ""
    num_turns: int = 0
    tool_calls: int = 0
    finish: str = "stop"
    prefix_breaks: int = 0
    frozen: bool = False  # a rewritten history ended the trajectory; later turns are answered, not recorded

    def add(self, ids: Sequence[int], model: bool, log_probs: Sequence[float] | None = None) -> None:
        self.response_ids += list(ids)
        self.mask += [int(model)] * len(ids)
        self.log_probs += list(log_probs) if log_probs is not None else [0.0] * len(ids)


def _same_turn(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.get("role") == b.get("role") and (a.get("content") or "").strip() == (b.get("content") or "").strip()


class OpenAIEndpoint:
    """`/episodes/<id>/v1/chat/completions` (and `/models`) over `engine`; `episodes[id]` keeps each context."""

    def __init__(self, engine: AsyncEngine, tokenizer: Any, parser: ToolParser, response_length: int,
                 model_name: str = "rlkit-policy", template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.engine, self.tokenizer, self.parser = engine, tokenizer, parser
        self.template_kwargs = dict(template_kwargs or {})  # data.apply_chat_template_kwargs
        self.response_length, self.model_name = response_length, model_name
        self.episodes: dict[int, EpisodeLog] = {}
        self._renderers: dict[str, ChatRenderer] = {}
        self._runner: Any = None
        self.port: int | None = None

    # ------------------------------------------------------------ server
    async def start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/episodes/{episode}/v1/chat/completions", self._chat)
        app.router.add_get("/episodes/{episode}/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def base_url(self, episode: int) -> str:
        return f"http://127.0.0.1:{self.port}/episodes/{episode}/v1"

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                              "owned_by": "rlkit"}]})

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        try:
            episode = int(request.match_info["episode"])
            body = await request.json()
            messages = [dict(m) for m in body["messages"]]
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}},
                                     status=400)
        if body.get("stream"):
            return web.json_response({"error": {"message": "stream=true is not supported by the rollout endpoint",
                                                "type": "invalid_request_error"}}, status=400)
        requested = body.get("max_completion_tokens") or body.get("max_tokens") or self.response_length
        reply = await self.complete(episode, messages, body.get("tools"), int(requested))
        return web.json_response(reply)

    # ------------------------------------------------------------ one turn
    def _renderer(self, tools: Any) -> ChatRenderer:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._renderers:
            schemas = list(tools) if tools else None
            instructions = self.parser.instructions(schemas) if schemas else None
            self._renderers[key] = ChatRenderer(self.tokenizer, schemas, instructions, self.template_kwargs)
        return self._renderers[key]

    def _context(self, ep: EpisodeLog, messages: list[dict[str, Any]], renderer: ChatRenderer) -> list[int]:
        """The token context for this request; records the new non-model tokens when it extends the episode."""
        if not ep.messages:  # the episode's first request: its rendering is the prompt
            ep.prompt_ids = renderer.prompt_ids(messages)
            ep.messages = messages
            return list(ep.prompt_ids)
        known = len(ep.messages)
        extends = len(messages) > known and all(_same_turn(a, b) for a, b in zip(messages, ep.messages))
        if ep.frozen or not extends:
            if not ep.frozen:
                ep.prefix_breaks += 1
                ep.frozen = True
            return renderer.prompt_ids(messages)  # answered from its own rendering, not recorded
        delta = renderer.append_ids(messages[known:], ep.last_token_text)
        if len(delta) >= self.response_length - len(ep.response_ids):
            ep.finish, ep.frozen = "length", True
            return []
        ep.add(delta, model=False)
        ep.messages = messages
        return ep.prompt_ids + ep.response_ids

    async def complete(self, episode: int, messages: list[dict[str, Any]], tools: Any, max_tokens: int) -> dict:
        """One chat completion of `episode` (what the HTTP handler returns as JSON)."""
        ep = self.episodes.setdefault(episode, EpisodeLog())
        context = self._context(ep, messages, self._renderer(tools))
        record = not ep.frozen  # False after a rewritten history or a spent budget: answered, not trained on
        budget = self.response_length - len(ep.response_ids) if record else max_tokens
        if not context or budget <= 0:
            if record:
                ep.finish = "length"
            return self._reply("", [], "length", len(context), 0)
        out = await self.engine.generate(TurnRequest(context, min(max_tokens, budget), episode, ep.num_turns))
        text = self.tokenizer.decode(out.token_ids, skip_special_tokens=False)
        parsed = self.parser.parse(text)
        content = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        if parsed.calls:
            content = parsed.content
        calls = [c for c in parsed.calls if c.error is None]
        finish = ("tool_calls" if calls else "stop") if out.stopped else "length"
        if record:
            ep.add(out.token_ids, model=True, log_probs=out.log_probs)
            ep.num_turns += 1
            ep.tool_calls += len(parsed.calls)
            ep.finish = "stop" if out.stopped else "length"
            last = out.token_ids[-1] if out.token_ids else None
            ep.last_token_text = self.tokenizer.decode([last]) if last is not None and out.stopped else ""
            ep.messages.append({"role": "assistant", "content": content})
        return self._reply(content, calls, finish, len(context), len(out.token_ids))

    def _reply(self, content: str, calls: list, finish: str, prompt_tokens: int, completion_tokens: int) -> dict:
        tool_calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }  # fmt: skip
