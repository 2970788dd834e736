"""Chat rendering of observations (delta tokens), and the batching server over a batched backend."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlkit.protocol import Batch
from rlkit.rollout.agent.chat import ChatRenderer
from rlkit.rollout.agent.engine import BatchingServer, TurnRequest, left_pad, plan_groups
from rlkit.rollout.agent.parser import HermesParser
from rlkit.rollout.agent.tools import build_tools
from rlkit.rollout.base import RolloutBackend, SamplingConfig, assemble_output
from rlkit.testing import build_tiny_tokenizer

# A tools-aware ChatML template written for this test (tools in the system turn, tool results
# grouped into one user turn), the shape of many recent chat models' templates.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t['function']['name'] }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def tools_tokenizer():
    tok = build_tiny_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def test_native_tools_template(tools_tokenizer):
    schemas = [t.schema() for t in build_tools(["calculator", "python"]).values()]
    r = ChatRenderer(tools_tokenizer, schemas, HermesParser().instructions(schemas))
    assert r.native_tools
    prompt = r.render(r.prompt_messages([{"role": "user", "content": "hi"}]), True, tools=schemas)
    assert prompt.startswith("<|im_start|>system\nTools:\ncalculator\npython\n")
    assert r.turn_end == "<|im_end|>\n"
    tools = [{"role": "tool", "name": "calculator", "content": "5"}, {"role": "tool", "name": "python", "content": "6"}]
    after_eos = r.append_text(tools, "<|im_end|>")
    # transformers renders with trim_blocks: the newline right after a block tag is dropped
    assert after_eos == ("\n<|im_start|>user<tool_response>\n5\n</tool_response><tool_response>\n6\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    after_tool_end = r.append_text(tools[:1], "")
    assert after_tool_end.startswith("<|im_end|>\n<|im_start|>user<tool_response>\n5")


def test_fallback_tool_instructions_go_to_the_system_message():
    tok = build_tiny_tokenizer()  # its template ignores tools=
    schemas = [t.schema() for t in build_tools(["calculator"]).values()]
    r = ChatRenderer(tok, schemas, HermesParser().instructions(schemas))
    assert not r.native_tools
    msgs = r.prompt_messages([{"role": "user", "content": "hi"}])
    assert msgs[0]["role"] == "system" and "<tool_call>" in msgs[0]["content"]
    merged = r.prompt_messages([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert len(merged) == 2 and merged[0]["content"].startswith("be brief\n\n# Tools")
    plain = ChatRenderer(tok)  # no tools: prompts are rendered as the dataset does
    assert plain.prompt_messages([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]


def test_non_append_only_template_is_refused():
    from rlkit.errors import UserError

    tok = build_tiny_tokenizer()
    tok.chat_template = (  # drops every assistant turn that a tool message follows: not append-only
        "{% for m in messages %}{% if not (m['role'] == 'assistant' and not loop.last and "
        "messages[loop.index0 + 1]['role'] == 'tool') %}{{ m['role'] }}: {{ m['content'] }} .{% endif %}"
        "{% endfor %}"
    )
    with pytest.raises(UserError, match="append-only"):
        ChatRenderer(tok)


class EchoBackend(RolloutBackend):
    """Answers every row with `reply` (+ EOS), recording the batch sizes and response lengths it was asked for."""

    def __init__(self, reply: list[int], eos: int = 5, pad: int = 0) -> None:
        self.reply, self.stop_ids, self.pad_id = reply, [eos], pad
        self.calls: list[tuple[int, int]] = []

    def generate(self, prompts: Batch, sampling: SamplingConfig) -> Batch:
        rows, length = len(prompts), sampling.response_length
        self.calls.append((rows, length))
        ids = (self.reply + self.stop_ids)[:length]
        responses = torch.full((rows, length), self.pad_id)
        responses[:, : len(ids)] = torch.tensor(ids)
        mask = torch.zeros((rows, length), dtype=torch.long)
        mask[:, : len(ids)] = 1
        return assemble_output(prompts, responses, mask, torch.full((rows, length), -0.5) * mask)

    def update_weights(self, named_tensors):
        return 0


def test_batching_server_merges_concurrent_requests():
    backend = EchoBackend([7, 8, 9])
    server = BatchingServer(backend, SamplingConfig(response_length=10, calculate_log_probs=True), wait_s=1.0)

    async def conversation(i: int):
        async with server.session():
            first = await server.generate(TurnRequest([1, 2, 3][: 1 + i % 3], 10, i, 0))
            await asyncio.sleep(0.01 * i)  # "tools" of different durations
            second = await server.generate(TurnRequest([1] + first.token_ids, 2, i, 1))
            return first, second

    async def main():
        try:
            return await asyncio.gather(*(conversation(i) for i in range(6)))
        finally:
            await server.aclose()

    results = asyncio.run(main())
    server.shutdown()
    assert backend.calls[0] == (6, 10), "the six first turns went out as one batch"
    assert sum(rows for rows, _ in backend.calls) == 12
    first, second = results[0]
    assert first.token_ids == [7, 8, 9, 5] and first.stopped and first.log_probs == [-0.5] * 4
    assert second.token_ids == [7, 8] and not second.stopped, "cut at the request's own budget"
    stats = server.stats.metrics()
    assert stats["agent/in_flight/max"] == 6 and stats["agent/batch_size/max"] == 6


def test_plan_groups_respects_the_context_window():
    reqs = [TurnRequest([0] * 10, 20), TurnRequest([0] * 25, 5), TurnRequest([0] * 5, 20), TurnRequest([0] * 28, 2)]
    assert plan_groups(reqs, None) == [[0, 2, 1, 3]]
    groups = plan_groups(reqs, 30)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    for g in groups:
        budget = max(reqs[i].max_tokens for i in g)
        assert all(len(reqs[i].prompt_ids) + budget <= 30 for i in g)
    assert groups[0] == [0, 2]


def test_left_pad():
    b = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert b["input_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
