"""Tools (calculator, python), the tool registry/runner and the hermes parser."""

from __future__ import annotations

import asyncio

import pytest

from rlkit.config.agent import MultiTurnConfig
from rlkit.errors import UserError
from rlkit.rollout.agent.builtin_tools import CalculatorError, PythonTool, calculate
from rlkit.rollout.agent.check import check_multi_turn
from rlkit.rollout.agent.parser import TOOL_PARSERS, HermesParser
from rlkit.rollout.agent.tools import TOOLS, build_tools, run_tool


@pytest.mark.parametrize("expr, want", [
    ("2 + 3", "5"), ("(12 + 30) * 4 / 3", "56"), ("7 / 2", "3.5"), ("2 ** 10", "1024"), ("2^10", "1024"),
    ("-3 + +4", "1"), ("sqrt(16)", "4"), ("max(1, 7, 3)", "7"), ("1,000 * 3", "3000"), ("10 // 3", "3"),
    ("10 % 4", "2"), ("1 / 3", "0.333333333333"), (" 2 + 3 ", "5"), ("round(2.567, 2)", "2.57"),
])  # fmt: skip
def test_calculator_values(expr, want):
    assert calculate(expr) == want


@pytest.mark.parametrize("expr", [
    "__import__('os').system('echo hi')", "open('/etc/passwd')", "x + 1", "[1, 2]", "'a' * 3", "1 / 0",
    "10 ** 100000", "(10 ** 300) ** 300", "2 ** 0.5 ** -4000", "(-8) ** 0.5", "lambda: 1", "", "1; 2",
    "9" * 600, "(1).__class__", "1e308 * 10",
])  # fmt: skip
def test_calculator_refuses(expr):
    with pytest.raises(CalculatorError):
        calculate(expr)


def test_calculator_tool_reports_errors_as_results():
    calc = build_tools(["calculator"])["calculator"]
    ok = asyncio.run(run_tool(calc, {"expression": "6 * 7"}, None, 1.0))
    bad = asyncio.run(run_tool(calc, {"expression": "import os"}, None, 1.0))
    missing = asyncio.run(run_tool(calc, {}, None, 1.0))
    not_dict = asyncio.run(run_tool(calc, ["6 * 7"], None, 1.0))
    assert ok.text == "42" and ok.ok
    assert bad.error == "calculator_error" and bad.text.startswith("Error:")
    assert missing.error == "bad_arguments" and "expression" in missing.text
    assert not_dict.error == "bad_arguments"


def test_schemas_are_openai_functions():
    tools = build_tools(["calculator", "python"])
    for name, tool in tools.items():
        s = tool.schema()
        assert s["type"] == "function" and s["function"]["name"] == name
        assert s["function"]["parameters"]["type"] == "object" and s["function"]["parameters"]["required"]


def test_python_tool_runs_in_the_sandbox():
    tool = PythonTool(wall_s=15.0)  # generous: a loaded CI machine starts Python slowly
    ok = asyncio.run(run_tool(tool, {"code": "print(sum(range(10)))"}, None, 30))
    assert ok.ok and ok.text == "45"
    err = asyncio.run(run_tool(tool, {"code": "raise ValueError('bad')"}, None, 30))
    assert err.error == "runtime_error" and "ValueError: bad" in err.text
    pre = asyncio.run(run_tool(tool, {"code": "print(f(2))"}, {"preamble": "def f(x):\n    return x * 3"}, 30))
    assert pre.text == "6"


def test_python_tool_limits():
    loop = asyncio.run(run_tool(PythonTool(wall_s=1.0), {"code": "while True: pass"}, None, 30))
    assert loop.error == "timeout" and "[timeout]" in loop.text
    tool = PythonTool(wall_s=15.0, output_bytes=1000)
    flood = asyncio.run(run_tool(tool, {"code": "print('x' * 100000)"}, None, 30))
    assert flood.error == "output_limit" and len(flood.text) < 2000


def test_registry_and_config_names():
    assert {"calculator", "python"} <= set(TOOLS.names())
    assert "hermes" in TOOL_PARSERS
    with pytest.raises(UserError, match="calculater"):
        check_multi_turn(MultiTurnConfig(tools=["calculater"]))
    with pytest.raises(UserError, match="format"):
        check_multi_turn(MultiTurnConfig(format="xml"))
    with pytest.raises(UserError, match="max_turns"):
        MultiTurnConfig(max_turns=0)
    with pytest.raises(UserError, match="same setting"):
        MultiTurnConfig(max_turns=3, max_assistant_turns=5)
    assert MultiTurnConfig(max_turns=3).max_assistant_turns == 3  # rlkit's name sets verl's key
    assert MultiTurnConfig(max_tool_response_chars=100).max_tool_response_length == 100
    with pytest.raises(UserError, match="tool_response_truncate_side"):
        MultiTurnConfig(tool_response_truncate_side="both")


def test_hermes_parser_formats():
    p = HermesParser()
    one = p.parse('Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>')
    assert one.content == "Let me compute." and len(one.calls) == 1
    assert one.calls[0].name == "calculator" and one.calls[0].arguments == {"expression": "1+2"}
    two = p.parse('<tool_call>\n{"name": "a", "arguments": "{\\"x\\": 1}"}\n</tool_call>\n'
                  '<tool_call>{"name": "b"}</tool_call>')
    assert [(c.name, c.arguments, c.error) for c in two.calls] == [("a", {"x": 1}, None), ("b", {}, None)]
    spaced = p.parse('<tool_call> { " name " : " calculator " , " arguments " : { " expression " : " 2 " } } '
                     "</tool_call>")
    assert spaced.calls[0].name == "calculator" and spaced.calls[0].arguments == {"expression": " 2 "}
    assert p.parse("no calls here").calls == []
    bad = p.parse("<tool_call>{not json}</tool_call>").calls[0]
    assert bad.error and "JSON" in bad.error
    nameless = p.parse('<tool_call>{"arguments": {}}</tool_call>').calls[0]
    assert nameless.error
    dangling = p.parse('ok <tool_call>{"name": "a"')
    assert dangling.content == "ok" and dangling.calls[0].error and "not closed" in dangling.calls[0].error
    fenced = p.parse('<tool_call>```json\n{"name": "a", "arguments": {}}\n```</tool_call>').calls[0]
    assert fenced.name == "a" and fenced.error is None


def test_parser_instructions_mention_the_format():
    schemas = [t.schema() for t in build_tools(["calculator"]).values()]
    text = HermesParser().instructions(schemas)
    assert "<tool_call>" in text and "</tool_call>" in text and '"calculator"' in text


def test_gpt_oss_parser_reads_harmony_calls():
    """verl's second registered format: a commentary message addressed to functions.NAME, ended by <|call|>."""
    p = TOOL_PARSERS.get("gpt-oss")()
    turn = ('<|channel|>analysis<|message|>Maybe <|channel|>commentary to=functions.fake <|constrain|>json'
            '<|message|>{}<|call|> no.<|end|><|start|>assistant<|channel|>commentary to=functions.calculator '
            '<|constrain|>json<|message|>{"expression": "2+3"}<|call|>')
    parsed = p.parse(turn)
    assert [(c.name, c.arguments, c.error) for c in parsed.calls] == [("calculator", {"expression": "2+3"}, None)]
    first = p.parse('<|channel|>commentary to=functions.python<|message|>{"code": "print(1)"}<|call|>')
    assert [(c.name, c.arguments) for c in first.calls] == [("python", {"code": "print(1)"})]
    final = p.parse("<|channel|>final<|message|>The answer is 5.<|return|>")
    assert final.calls == [] and final.content == "The answer is 5."
    bad = p.parse("<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{oops<|call|>")
    assert bad.calls[0].name == "calculator" and "JSON" in bad.calls[0].error
