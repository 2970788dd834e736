"""Built-in external agent: a plain OpenAI-client tool loop, the reference user of the rollout endpoint.

`openai_tools` is what an agent framework does, written with the `openai` package only: send the
conversation and the tool schemas, run the tool calls of the reply with rlkit's tools, send the
results back as `tool` messages, until a reply has no tool call, `max_turns` replies were made, or the
reply was cut by the budget. Register your own with `@EXTERNAL_AGENTS.register("name")`: any async
callable `(base_url, messages, tools, **external_agent_config)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rlkit.rollout.agent.openai_endpoint import EXTERNAL_AGENTS
from rlkit.rollout.agent.tools import Tool, release_tool, run_tool


@EXTERNAL_AGENTS.register("openai_tools")
async def openai_tool_agent(base_url: str, messages: list[dict[str, Any]], tools: Mapping[str, Tool],
                            max_turns: int = 4, tool_timeout_s: float = 10.0, **_: Any) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="rlkit-rollout", max_retries=0)
    schemas = [t.schema() for t in tools.values()] or None
    conversation = [dict(m) for m in messages]
    episode = {name: tool.episode() for name, tool in tools.items()}
    try:
        for _ in range(max_turns):
            kwargs: dict[str, Any] = {"tools": schemas} if schemas else {}
            reply = await client.chat.completions.create(model="rlkit-policy", messages=conversation, **kwargs)
            choice = reply.choices[0]
            message: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
            calls = choice.message.tool_calls or []
            if calls:
                message["tool_calls"] = [c.model_dump() for c in calls]
            conversation.append(message)
            if not calls or choice.finish_reason == "length":
                return
            for call in calls:
                tool = episode.get(call.function.name)
                if tool is None:
                    text = f"Error: unknown tool '{call.function.name}'"
                else:
                    try:
                        arguments = json.loads(call.function.arguments or "{}")
                    except ValueError:
                        arguments = None
                    text = (await run_tool(tool, arguments, {}, tool_timeout_s)).text
                conversation.append({"role": "tool", "tool_call_id": call.id, "content": text})
    finally:
        await client.close()
        for tool in episode.values():
            if tool.stateful:
                await release_tool(tool)
