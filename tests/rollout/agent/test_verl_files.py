"""verl's tool-config and interaction-config YAML files (`multi_turn.tool_config_path`,
`multi_turn.interaction_config_path`) load into rlkit's tools and simulated users."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from rlkit.config.agent import MultiTurnConfig
from rlkit.errors import UserError
from rlkit.rollout.agent.check import check_multi_turn
from rlkit.rollout.agent.interaction import GSM8KRetry
from rlkit.rollout.agent.tools import TOOLS, build_tools, load_builtin_tools, run_tool
from rlkit.rollout.agent.verl_files import build_configured_interaction, build_configured_tools

load_builtin_tools()
GSM8K_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "A tool for calculating the reward of gsm8k.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}


def write(tmp_path, name, data) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_verl_tool_config_loads_the_tools_of_rlkits_own_config(tmp_path):
    python_schema = TOOLS.get("python")().schema()
    path = write(tmp_path, "tools.yaml", {"tools": [
        {"class_name": "calculator", "config": {"type": "native"}, "tool_schema": TOOLS.get("calculator")().schema()},
        {"class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
         "config": {"sandbox_fusion_url": "http://unused", "num_workers": 10, "default_timeout": 3,
                    "memory_limit_mb": 256, "default_language": "python", "type": "native"},
         "tool_schema": python_schema},
    ]})
    from_file = build_configured_tools(MultiTurnConfig(enable=True, tool_config_path=path))
    own = build_tools(["calculator", "python"], {"python": {"wall_s": 3, "memory_mb": 256}})
    assert list(from_file) == list(own) == ["calculator", "python"]
    for name in own:
        assert type(from_file[name]) is type(own[name])
        assert from_file[name].schema() == own[name].schema()
    assert from_file["python"].limits == own["python"].limits


def test_the_yaml_tool_schema_is_what_the_model_sees_and_calls(tmp_path):
    path = write(tmp_path, "gsm8k.yaml", {"tools": [
        {"class_name": "verl.tools.gsm8k_tool.Gsm8kTool", "config": {"type": "native"}, "tool_schema": GSM8K_SCHEMA}]})
    mt = MultiTurnConfig(enable=True, tool_config_path=path)
    check_multi_turn(mt)
    tools = build_configured_tools(mt)
    assert list(tools) == ["calc_gsm8k_reward"] and tools["calc_gsm8k_reward"].schema() == GSM8K_SCHEMA
    tool = tools["calc_gsm8k_reward"]
    right = asyncio.run(run_tool(tool, {"answer": "72"}, {"ground_truth": "72"}, 5))
    wrong = asyncio.run(run_tool(tool, {"answer": "7"}, {"ground_truth": "72"}, 5))
    assert right.ok and "reward 1" in right.text and "reward 0" in wrong.text
    missing = asyncio.run(run_tool(tool, {}, {"ground_truth": "72"}, 5))
    assert missing.error == "bad_arguments" and "calc_gsm8k_reward" in missing.text


def test_verls_geo3k_tool_grades_the_submitted_answer_by_math_equivalence(tmp_path):
    schema = {**GSM8K_SCHEMA, "function": {**GSM8K_SCHEMA["function"], "name": "calc_geo3k_reward"}}
    path = write(tmp_path, "geo3k.yaml", {"tools": [
        {"class_name": "verl.tools.geo3k_tool.Geo3kTool", "config": {"type": "native"}, "tool_schema": schema}]})
    tool = build_configured_tools(MultiTurnConfig(enable=True, tool_config_path=path))["calc_geo3k_reward"]
    right = asyncio.run(run_tool(tool, {"answer": "2\\sqrt{3}"}, {"ground_truth": "\\sqrt{12}"}, 30))
    wrong = asyncio.run(run_tool(tool, {"answer": "3"}, {"ground_truth": "\\sqrt{12}"}, 30))
    assert "reward 1" in right.text and "reward 0" in wrong.text


def test_verls_search_tool_queries_the_retrieval_service_it_names(tmp_path):
    import http.server
    import json
    import threading

    seen = []

    class Retriever(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            result = [[{"document": {"contents": f"Title {q}\nabout {q}"}, "score": 1.0}] * body["topk"]
                      for q in body["queries"]]
            data = json.dumps({"result": result}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Retriever)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    schema = {"type": "function", "function": {"name": "search", "description": "web search", "parameters": {
        "type": "object", "properties": {"query_list": {"type": "array", "item": {"type": "string"}}},
        "required": ["query_list"]}}}
    url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    path = write(tmp_path, "search.yaml", {"tools": [
        {"class_name": "verl.tools.search_tool.SearchTool", "tool_schema": schema,
         "config": {"retrieval_service_url": url, "topk": 2, "timeout": 5, "num_workers": 120, "type": "native"}}]})
    try:
        tool = build_configured_tools(MultiTurnConfig(enable=True, tool_config_path=path))["search"]
        out = asyncio.run(run_tool(tool, {"query_list": ["paris", "rome"]}, {}, 10))
    finally:
        server.shutdown()
    assert seen == [{"queries": ["paris", "rome"], "topk": 2, "return_scores": True}]
    assert out.ok and "Doc 2 (Title: Title rome)\nabout rome" in out.text and "Query: paris" in out.text
    tool.url = url  # the service is gone now: an error result, the rollout goes on
    down = asyncio.run(run_tool(tool, {"query_list": ["x"]}, {}, 10))
    assert down.error == "service" and url in down.text


@pytest.mark.parametrize("entry, message", [
    ({"class_name": "verl.tools.image_zoom_in_tool.ImageZoomInTool", "config": {"type": "native"}},
     r"class_name 'verl.tools.image_zoom_in_tool.ImageZoomInTool' has no rlkit counterpart.*calculator.*python"),
    ({"class_name": "verl.tools.search_tool.SearchTool", "config": {"type": "native"}},
     "config.retrieval_service_url is required"),
    ({"class_name": "verl.tools.mcp_search_tool.MCPSearchTool", "config": {"type": "mcp"}}, "config.type 'mcp'"),
    ({"class_name": "python", "tool_schema": GSM8K_SCHEMA}, r"lacks the parameter\(s\) \['code'\]"),
    ({"class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool", "config": {"default_language": "cpp"}},
     "runs python only"),
])
def test_tools_rlkit_cannot_run_are_refused_in_one_line(tmp_path, entry, message):
    path = write(tmp_path, "tools.yaml", {"tools": [entry]})
    with pytest.raises(UserError, match=message) as err:
        check_multi_turn(MultiTurnConfig(tool_config_path=path))
    assert "tool_config_path" in str(err.value) and "\n" not in str(err.value)


def test_tool_config_path_replaces_the_tools_key(tmp_path):
    path = write(tmp_path, "tools.yaml", {"tools": [{"class_name": "calculator"}]})
    assert MultiTurnConfig(tool_config_path=path).tools == []  # the file's tools, not the default calculator
    with pytest.raises(UserError, match="leave .*tools"):
        MultiTurnConfig(tool_config_path=path, tools=["python"])
    with pytest.raises(UserError, match="no such file"):
        MultiTurnConfig(tool_config_path=str(tmp_path / "missing.yaml"))


def test_a_verl_interaction_config_loads_the_gsm8k_user(tmp_path):
    path = write(tmp_path, "interaction.yaml", {"interaction": [
        {"name": "gsm8k", "class_name": "verl.interactions.gsm8k_interaction.Gsm8kInteraction", "config": {}}]})
    mt = MultiTurnConfig(enable=True, interaction_config_path=path)
    check_multi_turn(mt)
    user = build_configured_interaction(mt)
    assert isinstance(user, GSM8KRetry) and user.max_retries is None and user.method == "strict"
    wrong = [{"role": "assistant", "content": "#### 4"}]
    again = asyncio.run(user.respond(wrong, replies=50, ground_truth="5"))
    assert again.message is not None and again.reward == 0.0, "no retry limit: the turn limits end the episode"
    done = asyncio.run(user.respond([{"role": "assistant", "content": "#### 5"}], replies=1, ground_truth="5"))
    assert done.message is None and done.reward == 1.0
    rlkit_name = write(tmp_path, "own.yaml", {"interaction": [{"class_name": "fixed_reply",
                                                                "config": {"message": "more", "max_replies": 2}}]})
    own = build_configured_interaction(MultiTurnConfig(interaction_config_path=rlkit_name))
    assert own.message == "more" and own.max_replies == 2
    two = write(tmp_path, "two.yaml", {"interaction": [{"class_name": "fixed_reply"}, {"class_name": "gsm8k_retry"}]})
    with pytest.raises(UserError, match="one simulated user"):
        check_multi_turn(MultiTurnConfig(interaction_config_path=two))


def test_verl_gsm8k_tool_config_end_to_end_in_the_loop(tmp_path):
    """verl's gsm8k setup as its scripts run it: the YAML's tool, called by its schema name, with the row's
    ground truth in verl's dataset layout (extra_info.tools_kwargs.<name>.create_kwargs)."""
    from rlkit.data.collation import collate
    from rlkit.rollout.agent.loop import AgentLoop
    from rlkit.rollout.agent.parser import HermesParser
    from rlkit.utils.async_run import run_coroutine
    from tests.rollout.agent.scripted import ScriptedEngine, call, tiny_tokenizer

    tok = tiny_tokenizer()  # word-level: the tool is named with a word it knows ("answer", not calc_gsm8k_reward)
    schema = {"type": "function", "function": {**GSM8K_SCHEMA["function"], "name": "answer"}}
    path = write(tmp_path, "gsm8k.yaml", {"tools": [
        {"class_name": "verl.tools.gsm8k_tool.Gsm8kTool", "config": {"type": "native"}, "tool_schema": schema}]})
    mt = MultiTurnConfig(enable=True, tool_config_path=path)
    engine = ScriptedEngine(tok, {0: [call("answer", answer="5"), "#### 5"], 1: [call("answer", answer="4"), "#### 4"]})
    loop = AgentLoop(engine, tok, mt, build_configured_tools(mt), HermesParser())
    assert loop.renderer.tool_schemas == [schema]
    msgs = [{"role": "user", "content": "what is 2 + 3 ?"}]
    ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    extra = {"tools_kwargs": {"answer": {"create_kwargs": {"ground_truth": "5"}}}}
    prompts = collate([{"input_ids": ids["input_ids"], "raw_prompt": msgs, "extra_info": extra}] * 2, 400,
                      tok.pad_token_id)
    trajs = run_coroutine(loop.run_all(loop.samples_from(prompts), 200))
    results = [[m["content"] for m in t.messages if m["role"] == "tool"] for t in trajs]
    assert results == [["answer '5': reward 1"], ["answer '4': reward 0"]]
