"""The OpenAI-compatible rollout endpoint (`multi_turn.external_agent`): a real aiohttp server, the real `openai`
client (the built-in `openai_tools` agent), and `ScriptedEngine` (a deterministic fake engine, tests/rollout/agent/
scripted.py) standing in for the model, so the recorded tokens can be checked exactly."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.agent import MultiTurnConfig
from rlkit.rollout.agent.loop import AgentLoop
from rlkit.rollout.agent.openai_endpoint import EXTERNAL_AGENTS, OpenAIEndpoint
from rlkit.rollout.agent.parser import HermesParser
from rlkit.rollout.agent.tools import build_tools
from rlkit.utils.async_run import run_coroutine
from tests.rollout.agent.scripted import ScriptedEngine, call
from tests.rollout.agent.test_loop_scripted import TOK, make_prompts

SCRIPTS = {0: [call("calculator", expression="2 + 3"), "the answer is 5"], 1: ["the answer is 4"],
           2: [call("calculator", expression="1 + 1"), call("calculator", expression="2 * 2"), "#### 4"]}


def run_loop(scripts, n, response_length=120, **cfg):
    engine = ScriptedEngine(TOK, scripts)
    loop = AgentLoop(engine, TOK, MultiTurnConfig(enable=True, **cfg), build_tools(["calculator"]), HermesParser())
    return loop.generate(make_prompts(n), response_length, True), engine


def test_external_agent_trains_on_the_same_tokens_as_the_built_in_loop():
    """The same scripted model through the OpenAI API: prompt, model tokens (mask 1, log-probs) and tool tokens
    (mask 0) equal the built-in agent loop's, so an external framework's episodes train exactly like ours."""
    inside, _ = run_loop(SCRIPTS, 3)
    outside, engine = run_loop(SCRIPTS, 3, external_agent="openai_tools")
    for key in ("prompts", "responses", "response_mask", "attention_mask", "rollout_log_probs"):
        assert torch.equal(inside[key], outside[key]), key
    assert list(outside["agent/num_turns"]) == [2, 1, 3] and list(outside["agent/tool_calls"]) == [1, 0, 2]
    # every engine request of a later turn extended the recorded context: no re-tokenised model text
    for sample, outs in engine.outputs.items():
        reqs = [r for r in engine.requests if r.sample_index == sample]
        for before, after, out in zip(reqs, reqs[1:], outs):
            assert after.prompt_ids[: len(before.prompt_ids) + len(out)] == before.prompt_ids + out


def test_rewritten_history_ends_the_trajectory_and_the_budget_caps_replies():
    async def rewriter(base_url, messages, tools, **_):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        first = await client.chat.completions.create(model="m", messages=messages)
        assert first.choices[0].finish_reason == "stop"
        edited = [*messages, {"role": "assistant", "content": "something else"}, {"role": "user", "content": "what"}]
        second = await client.chat.completions.create(model="m", messages=edited)
        assert second.choices[0].message.content  # answered anyway, from its own rendering
        await client.close()

    EXTERNAL_AGENTS.register("test_rewriter")(rewriter)
    try:
        out, engine = run_loop({0: ["the answer is 4", "the answer is 5"]}, 1, external_agent="test_rewriter")
    finally:
        EXTERNAL_AGENTS.unregister("test_rewriter")
    assert out["agent/num_turns"][0] == 1 and len(engine.requests) == 2
    assert int(out["response_mask"][0].sum()) == len(engine.outputs[0][0])  # only the first, consistent turn
    assert out.meta["metrics"]["agent/prefix_breaks/sum"] == 1

    short, _ = run_loop({0: [call("calculator", expression="2 + 3"), "the answer is 5"]}, 1, response_length=30,
                        external_agent="openai_tools")
    assert short["agent/finish"][0] == "length" and int(short["attention_mask"][0, -30:].sum()) <= 30


def test_endpoint_speaks_openai_json_and_rejects_what_it_cannot_do():
    import aiohttp

    async def scenario():
        endpoint = OpenAIEndpoint(ScriptedEngine(TOK, {7: [call("calculator", expression="2 + 3")]}), TOK,
                                  HermesParser(), response_length=64)
        await endpoint.start()
        try:
            async with aiohttp.ClientSession() as http:
                url = endpoint.base_url(7)
                models = await (await http.get(f"{url}/models")).json()
                body = {"model": "rlkit-policy", "messages": [{"role": "user", "content": "what is 2 + 3 ?"}]}
                reply = await (await http.post(f"{url}/chat/completions", json=body)).json()
                streamed = await http.post(f"{url}/chat/completions", json={**body, "stream": True})
                broken = await http.post(f"{url}/chat/completions", json={"model": "m"})
                return models, reply, streamed.status, broken.status
        finally:
            await endpoint.close()

    models, reply, stream_status, broken_status = run_coroutine(scenario())
    assert models["data"][0]["id"] == "rlkit-policy"
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and reply["object"] == "chat.completion"
    [tool_call] = choice["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "calculator" and tool_call["type"] == "function"
    assert {"expression"} == set(__import__("json").loads(tool_call["function"]["arguments"]))
    assert reply["usage"]["completion_tokens"] > 0
    assert stream_status == 400 and broken_status == 400


def test_unknown_external_agent_and_rows_without_messages_are_clear_errors():
    from rlkit.errors import UserError
    from rlkit.rollout.agent.check import check_multi_turn

    with pytest.raises(UserError, match="external_agent: 'nope' is not registered"):
        check_multi_turn(MultiTurnConfig(enable=True, external_agent="nope"))
    engine = ScriptedEngine(TOK, {})
    loop = AgentLoop(engine, TOK, MultiTurnConfig(enable=True, external_agent="openai_tools"),
                     build_tools(["calculator"]), HermesParser())
    prompts = make_prompts(1)
    prompts.non_tensors.pop("raw_prompt")
    with pytest.raises(UserError, match="prompt as chat messages"):
        loop.generate(prompts, 32, True)
