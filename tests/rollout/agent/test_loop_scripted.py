"""Agent loop mechanics against `ScriptedEngine`, a deterministic fake engine that emits planned turns."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rlkit.config.agent import MultiTurnConfig
from rlkit.data.collation import collate
from rlkit.protocol import Batch
from rlkit.rollout.agent.interaction import GSM8KRetry
from rlkit.rollout.agent.loop import AgentLoop
from rlkit.rollout.agent.parser import HermesParser
from rlkit.rollout.agent.tools import build_tools
from tests.rollout.agent.scripted import BrokenTool, ScriptedEngine, SlowTool, StuckTool, call, tiny_tokenizer

TOK = tiny_tokenizer()
PROMPT_WIDTH = 200


def make_prompts(n: int, **columns) -> Batch:
    msgs = [{"role": "user", "content": "what is 2 + 3 ?"}]
    rows = []
    for i in range(n):
        text = TOK.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        row = {"input_ids": TOK(text, add_special_tokens=False)["input_ids"], "raw_prompt": msgs}
        row.update({k: v[i] for k, v in columns.items()})
        rows.append(row)
    return collate(rows, PROMPT_WIDTH, TOK.pad_token_id)


def run(scripts, n=1, response_length=120, tools=None, engine_kw=None, prompts=None, interaction=None, **cfg):
    config = MultiTurnConfig(enable=True, **cfg)
    engine = ScriptedEngine(TOK, scripts, **(engine_kw or {}))
    tools = tools if tools is not None else build_tools(["calculator"])
    loop = AgentLoop(engine, TOK, config, tools, HermesParser(), interaction=interaction)
    out = loop.generate(prompts if prompts is not None else make_prompts(n), response_length, True)
    return out, engine


def segments(out: Batch, row: int) -> list[tuple[int, list[int]]]:
    """(mask value, token ids) runs of the valid part of a response."""
    valid = int(out["attention_mask"][row, PROMPT_WIDTH:].sum())
    ids = out["responses"][row, :valid].tolist()
    mask = out["response_mask"][row, :valid].tolist()
    runs: list[tuple[int, list[int]]] = []
    for t, m in zip(ids, mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(t)
        else:
            runs.append((m, [t]))
    return runs


def check_layout(out: Batch, engine: ScriptedEngine, response_length: int) -> None:
    """response_mask is 1 exactly on the engine's tokens; the rest of the layout is the rollout contract."""
    rows = len(out)
    assert out["responses"].shape == out["response_mask"].shape == (rows, response_length)
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))
    for i in range(rows):
        model_turns = engine.outputs[i]
        runs = segments(out, i)
        assert [ids for m, ids in runs if m == 1] == model_turns, "model tokens are the engine's, untouched"
        assert runs[0][0] == 1 and runs[-1][0] == 1, "a response starts and ends with model tokens"
        valid = out["attention_mask"][i, PROMPT_WIDTH:]
        n = int(valid.sum())
        assert valid[:n].all() and not valid[n:].any(), "tool tokens are attended to; padding only at the end"
        assert not out["response_mask"][i, n:].any()
        pos = out["position_ids"][i]
        assert torch.equal(pos[PROMPT_WIDTH:], pos[PROMPT_WIDTH - 1] + torch.arange(1, response_length + 1))
        lps = out["rollout_log_probs"][i]
        expected = [-(k + 1) / 100 for turn in model_turns for k in range(len(turn))]
        assert torch.allclose(lps[out["response_mask"][i].bool()], torch.tensor(expected))
        assert (lps[~out["response_mask"][i].bool()] == 0).all()


def text(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=False)


def test_fake_engine_one_tool_call():
    scripts = {0: [call("calculator", expression="2 + 3"), "the answer is 5"]}
    out, engine = run(scripts)
    check_layout(out, engine, 120)
    runs = segments(out, 0)
    assert [m for m, _ in runs] == [1, 0, 1]
    assert text(runs[1][1]) == "<|im_start|> tool 5 <|im_end|> <|im_start|> assistant"
    assert out["agent/num_turns"][0] == 2 and out["agent/tool_calls"][0] == 1 and out["agent/tool_errors"][0] == 0
    assert out["agent/finish"][0] == "stop"
    # the second request is the prompt + everything so far, verbatim
    second = engine.requests[1]
    prompt = out["prompts"][0][out["attention_mask"][0, :PROMPT_WIDTH].bool()].tolist()
    assert second.prompt_ids == prompt + runs[0][1] + runs[1][1]
    m = out.meta["metrics"]
    assert m["num_turns/mean"] == 2 and m["tool_calls/mean"] == 1 and m["tool_errors/sum"] == 0


def test_fake_engine_several_tool_calls_over_turns_and_tools_kwargs():
    slow = SlowTool(0.0)
    scripts = {0: [call("calculator", expression="1 + 1"), call("reverse"), call("calculator", expression="2 * 4"),
                   "#### 8"]}
    prompts = make_prompts(1, tools_kwargs=[{"reverse": {"secret": "7"}}])
    out, engine = run(scripts, tools={**build_tools(["calculator"]), "reverse": slow}, prompts=prompts)
    check_layout(out, engine, 120)
    tool_texts = [text(ids) for m, ids in segments(out, 0) if m == 0]
    assert [t.split()[2] for t in tool_texts] == ["2", "1", "8"]
    assert out["agent/num_turns"][0] == 4 and out["agent/tool_calls"][0] == 3
    assert slow.kwargs == [{"secret": "7"}], "per-sample tools_kwargs reach the tool"


def test_fake_engine_parallel_calls_in_one_turn_and_across_samples():
    slow = SlowTool(0.3)
    turn = " ".join([call("reverse")] * 4)
    scripts = {i: [turn, "#### 1"] for i in range(4)}
    start = time.perf_counter()
    out, engine = run(scripts, n=4, response_length=250, tools={"reverse": slow}, max_parallel_tools=16,
                      max_parallel_calls=4)
    elapsed = time.perf_counter() - start
    check_layout(out, engine, 250)
    assert slow.calls == 16 and slow.max_running == 16
    assert elapsed < 16 * 0.3 / 4, f"16 calls of 0.3 s ran in {elapsed:.2f}s: not concurrent"
    assert engine.max_active == 4, "all conversations in flight at once"
    assert list(out["agent/tool_calls"]) == [4, 4, 4, 4]
    # the results of one turn come back in call order, as consecutive tool messages
    assert text(segments(out, 0)[1][1]).count("<|im_start|> tool 1 <|im_end|>") == 4


def test_fake_engine_parallel_tools_are_bounded():
    slow = SlowTool(0.1)
    scripts = {i: [" ".join([call("reverse")] * 3), "#### 1"] for i in range(2)}
    out, _ = run(scripts, n=2, response_length=250, tools={"reverse": slow}, max_parallel_tools=2,
                 max_parallel_calls=3)
    assert slow.calls == 6 and slow.max_running == 2


def test_fake_engine_failing_tools_become_error_messages():
    tools = {**build_tools(["calculator"]), "think": BrokenTool(), "step": StuckTool()}
    scripts = {
        0: [call("think"), "#### 1"],  # raises
        1: [call("step"), "#### 1"],  # times out
        2: [call("answer"), "#### 1"],  # unknown tool
        3: ['<tool_call> { " name " : </tool_call>', "#### 1"],  # bad JSON
        4: [call("calculator", expression="1 / 0"), "#### 1"],  # the tool reports an error
        5: [call("calculator"), "#### 1"],  # missing argument
    }
    start = time.perf_counter()
    out, engine = run(scripts, n=6, response_length=150, tools=tools, tool_timeout_s=0.3)
    assert time.perf_counter() - start < 10
    check_layout(out, engine, 150)
    assert list(out["agent/tool_errors"]) == [1] * 6
    assert list(out["agent/num_turns"]) == [2] * 6, "every rollout went on after its tool error"
    assert out.meta["metrics"]["tool_errors/sum"] == 6
    observations = [text(segments(out, i)[1][1]) for i in range(6)]
    assert "boom" in observations[0] or "<unk>" in observations[0]
    assert all(o.startswith("<|im_start|> tool") for o in observations)


def test_fake_engine_error_texts():
    """What the model reads after a failure (checked on the text before tokenisation)."""
    import asyncio

    from rlkit.rollout.agent.parser import ToolCall

    loop = AgentLoop(ScriptedEngine(TOK, {}), TOK, MultiTurnConfig(tool_timeout_s=0.2),
                     {"think": BrokenTool(), "step": StuckTool()}, HermesParser())

    async def go():
        import asyncio as aio

        loop._tool_sem = aio.Semaphore(4)
        return await loop._run_calls(
            [ToolCall("think"), ToolCall("step"), ToolCall("nope"), ToolCall("", {}, "bad json")], {}, {}
        )

    results = asyncio.run(go())
    assert results[0].text == "Error: RuntimeError: boom" and results[0].error == "exception"
    assert "timed out" in results[1].text and results[1].error == "timeout"
    assert "unknown tool 'nope'" in results[2].text and results[2].error == "unknown_tool"
    assert results[3].text == "Error: bad json" and results[3].error == "parse_error"


def test_fake_engine_max_turns():
    slow = SlowTool(0.0)
    scripts = {0: [call("reverse")] * 10}
    out, engine = run(scripts, tools={"reverse": slow}, max_turns=3, response_length=300)
    check_layout(out, engine, 300)
    assert out["agent/num_turns"][0] == 3 and out["agent/finish"][0] == "max_turns"
    assert slow.calls == 2, "the calls of the last allowed turn are not run"
    assert out["agent/tool_calls"][0] == 3


@pytest.mark.parametrize("length", [10, 30, 37, 45])
def test_fake_engine_response_length_cut(length):
    slow = SlowTool(0.0)
    scripts = {0: [call("reverse"), call("reverse"), "the answer is #### 1 2 3 4 5 6 7 8 9"]}
    out, engine = run(scripts, tools={"reverse": slow}, response_length=length)
    check_layout(out, engine, length)
    used = int(out["attention_mask"][0, PROMPT_WIDTH:].sum())
    assert used <= length
    assert out["agent/finish"][0] == "length"
    assert all(r.max_tokens == length - len(r.prompt_ids) + len(engine.requests[0].prompt_ids)
               for r in engine.requests), "each turn's budget is what is left of response_length"


def test_fake_engine_stop_at_tool_end_appends_the_turn_end():
    end_id = HermesParser().end_token_id(TOK)
    assert end_id is not None
    scripts = {0: [call("calculator", expression="2 + 3") + " the answer is 7", "#### 5"]}
    out, engine = run(scripts, engine_kw={"extra_stop_ids": [end_id]}, stop_at_tool_end=True)
    check_layout(out, engine, 120)
    runs = segments(out, 0)
    assert runs[0][1][-1] == end_id, "the turn stopped at </tool_call>"
    assert text(runs[1][1]) == "<|im_end|> <|im_start|> tool 5 <|im_end|> <|im_start|> assistant"


def test_fake_engine_simulated_user():
    scripts = {0: ["the answer is #### 4", "#### 5"], 1: ["#### 5"]}
    prompts = make_prompts(2, reward_model=[{"style": "rule", "ground_truth": "5"}] * 2)
    out, engine = run(scripts, n=2, prompts=prompts, interaction=GSM8KRetry(max_retries=2))
    check_layout(out, engine, 120)
    assert list(out["agent/num_turns"]) == [2, 1]
    assert list(out["agent/interaction_reward"]) == [1.0, 1.0]
    user = text(segments(out, 0)[1][1])
    assert user.startswith("<|im_start|> user") and user.endswith("<|im_start|> assistant")


def test_fake_engine_without_raw_prompt_uses_the_prompt_ids():
    prompts = make_prompts(2)
    prompts.non_tensors.pop("raw_prompt")
    out, engine = run({0: ["#### 1"], 1: ["#### 2"]}, n=2, prompts=prompts)
    assert torch.equal(out["prompts"], prompts["input_ids"])
    assert engine.requests[0].prompt_ids == prompts["input_ids"][0][prompts["attention_mask"][0].bool()].tolist()


def test_fake_engine_prompt_too_long_names_the_key():
    from rlkit.errors import UserError

    msgs = [{"role": "user", "content": "what is 2 + 3 ?"}]
    ids = TOK(TOK.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))["input_ids"]
    prompts = collate([{"input_ids": ids, "raw_prompt": msgs}], len(ids) + 2, TOK.pad_token_id)
    with pytest.raises(UserError, match="data.max_prompt_length"):
        run({}, prompts=prompts)


def test_fake_engine_metrics_and_non_tensors_carry_through():
    prompts = make_prompts(3, uid=np.array(["a", "a", "b"], dtype=object))
    out, _ = run({0: ["#### 1"], 1: [call("calculator", expression="1"), "#### 1"]}, n=3, prompts=prompts)
    assert list(out["uid"]) == ["a", "a", "b"]
    m = out.meta["metrics"]
    assert m["num_turns/max"] == 2 and m["num_turns/mean"] == pytest.approx(4 / 3)
    assert m["tool_calls/mean"] == pytest.approx(1 / 3)


def test_fake_engine_fixed_reply_user_and_broken_interaction():
    from rlkit.rollout.agent.interaction import FixedReply, Interaction

    out, engine = run({0: ["#### 1", "#### 2", "#### 3"]}, interaction=FixedReply("go on", max_replies=2))
    check_layout(out, engine, 120)
    assert out["agent/num_turns"][0] == 3
    assert [m for m, _ in segments(out, 0)] == [1, 0, 1, 0, 1]

    class Broken(Interaction):
        async def respond(self, messages, replies=0, **kwargs):
            raise KeyError("oops")

    out, engine = run({0: ["#### 1"]}, interaction=Broken())
    assert out["agent/num_turns"][0] == 1 and out["agent/finish"][0] == "stop"
    assert out.meta["metrics"]["interaction/errors/sum"] == 1


def test_fake_engine_batch_through_the_trainer_pieces():
    """Advantages, data metrics, balancing and the reward manager on an interleaved-mask batch."""
    from rlkit.algo import ADV_ESTIMATORS, AdvantageInputs
    from rlkit.algo.metrics import compute_data_metrics
    from rlkit.reward.manager import RewardManager
    from rlkit.workers.micro_batch import balance_across_ranks

    # (the tiny tokenizer's WordPiece decoder glues a non-initial "####" to the word before it: use the last number)
    scripts = {0: [call("calculator", expression="2 + 3"), "answer is 5"], 1: ["answer is 4"],
               2: [call("calculator", expression="2 + 2"), "answer is 4"], 3: ["answer is 5"]}
    prompts = make_prompts(4, uid=np.array(["a", "a", "b", "b"], dtype=object),
                           data_source=["gsm8k"] * 4, reward_model=[{"style": "rule", "ground_truth": "5"}] * 4)
    out, _ = run(scripts, n=4, prompts=prompts)
    mask = out["response_mask"]
    manager = RewardManager(TOK, num_workers=1, scorer_kwargs={"gsm8k": {"method": "flexible"}})
    scores = manager.compute(out)["token_level_scores"]
    last_model = (mask * torch.arange(mask.shape[1])).argmax(-1)
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 1.0], "the final answer after the tool result is scored"
    assert torch.equal(scores.nonzero()[:, 1], last_model[[0, 3]])
    adv, _ = ADV_ESTIMATORS.get("grpo")(AdvantageInputs(scores, mask.float(), index=out["uid"]))
    assert (adv[mask == 0] == 0).all() and (adv[0][mask[0].bool()] > 0).all()
    metrics = compute_data_metrics(Batch({**out.tensors, "token_level_scores": scores}))
    total = out["attention_mask"][:, PROMPT_WIDTH:].sum(-1).float()
    assert metrics["response_length/mean"] == pytest.approx(float(total.mean()))
    assert total[0] > mask[0].sum(), "tool tokens count toward length, not toward training"
    assert sorted(balance_across_ranks(out, 2).tolist()) == [0, 1, 2, 3]


def test_interaction_reward_joins_the_score_only_when_weighted():
    """interaction_reward_weight: 0 logs the simulated user's reward; w adds w x it on the last model token."""
    from rlkit.reward.interaction_reward import with_interaction_reward
    from rlkit.reward.manager import RewardManager

    scripts = {0: ["the answer is 4", "answer is 5"], 1: ["answer is 4", "answer is 3"]}
    prompts = make_prompts(2, data_source=["gsm8k"] * 2, reward_model=[{"style": "rule", "ground_truth": "5"}] * 2)
    out, _ = run(scripts, n=2, prompts=prompts, interaction=GSM8KRetry(max_retries=1))
    assert list(out["agent/interaction_reward"]) == [1.0, 0.0]  # row 0 right after "try again", row 1 never
    manager = RewardManager(TOK, num_workers=1, scorer_kwargs={"gsm8k": {"method": "flexible"}})
    assert with_interaction_reward(manager, 0.0) is manager
    plain = manager(out)["token_level_scores"]
    scored = with_interaction_reward(manager, 0.5)(out)
    mask = out["response_mask"]
    last_model = (mask * torch.arange(mask.shape[1])).argmax(-1)
    assert torch.allclose(scored["token_level_scores"].sum(-1), plain.sum(-1) + torch.tensor([0.5, 0.0]))
    assert scored["token_level_scores"][0, last_model[0]] == plain[0, last_model[0]] + 0.5
    assert scored.meta["metrics"]["reward/interaction/mean"] == [0.25]


def test_stateful_tool_gets_one_instance_per_episode_released_at_its_end():
    """Concurrent episodes each add to and see their own state; every episode's instance is released once, also
    when its release raises (counted, the rollout goes on); a stateless tool stays shared and is not released."""
    from rlkit.rollout.agent.tools import Tool, ToolResult, build_tools

    released: list[tuple[int, list[str]]] = []
    answers: dict[str, list[str]] = {}  # an episode's first value -> what its instance answered

    class Tally(Tool):  # named with words the tiny tokenizer knows
        name = "step"
        parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
        stateful = True

        def reset(self) -> None:
            self.values: list[str] = []

        def call(self, arguments, **kwargs):
            self.values.append(str(arguments["expression"]).strip())  # the tiny decoder pads words with spaces
            answer = " ".join(self.values)
            answers.setdefault(self.values[0], []).append(answer)
            return ToolResult(answer)

        async def release(self) -> None:
            released.append((id(self), list(self.values)))
            if self.values == ["9"]:
                raise OSError("disk gone")

    scripts = {
        0: [call("step", expression="1"), call("step", expression="2"), "#### 1"],
        1: [call("step", expression="5"), call("step", expression="6"), "#### 2"],
        2: [call("step", expression="9"), "#### 3"],
        3: [call("calculator", expression="1 + 1"), "#### 2"],
    }
    template = Tally()
    out, engine = run(scripts, n=4, tools={"step": template, **build_tools(["calculator"])})
    check_layout(out, engine, 120)
    assert answers == {"1": ["1", "1 2"], "5": ["5", "5 6"], "9": ["9"]}  # each episode saw its own state only
    assert sorted(v for _, v in released) == [["1", "2"], ["5", "6"], ["9"]]  # rows 0-2 once each, not row 3
    assert len({i for i, _ in released}) == 3 and id(template) not in {i for i, _ in released}
    assert out.meta["metrics"]["tool_release_errors/sum"] == 1
    assert list(out["agent/finish"]) == ["stop"] * 4


def test_notepad_is_per_episode():
    from rlkit.rollout.agent.tools import build_tools

    pad = build_tools(["notepad"])["notepad"]
    first, second = pad.episode(), pad.episode()
    assert first is not pad and second is not first
    assert first.call({"action": "write", "text": "x = 4"}).text == "saved note 1"
    assert first.call({"action": "read"}).text == "1. x = 4"
    assert second.call({"action": "read"}).text == "(no notes yet)"
    assert second.call({"action": "erase"}).error == "bad_arguments"
    first.release()
    with pytest.raises(RuntimeError, match="outside an episode"):
        pad.call({"action": "read"})


# ------------------------------------------------------------ verl's multi_turn keys
def test_turn_limits_follow_verl():
    """max_assistant_turns null: turns go on until a turn without a call (or the budget); max_user_turns counts
    the tool-result turns appended: at the limit the next turn's calls are not run."""
    scripts = {0: [call("reverse")] * 5 + ["#### 1"]}
    out, _ = run(scripts, tools={"reverse": SlowTool(0.0)}, response_length=400)
    assert out["agent/num_turns"][0] == 6 and out["agent/finish"][0] == "stop"
    slow = SlowTool(0.0)
    out, _ = run(scripts, tools={"reverse": slow}, response_length=400, max_user_turns=2)
    assert out["agent/num_turns"][0] == 3 and out["agent/finish"][0] == "max_turns" and slow.calls == 2
    slow = SlowTool(0.0)
    out, _ = run(scripts, tools={"reverse": slow}, response_length=400, max_assistant_turns=2)
    assert out["agent/num_turns"][0] == 2 and out["agent/finish"][0] == "max_turns" and slow.calls == 1


def test_max_parallel_calls_runs_the_first_calls_of_a_turn():
    slow = SlowTool(0.0)
    scripts = {0: [" ".join([call("reverse")] * 3), "#### 1"]}
    out, _ = run(scripts, tools={"reverse": slow}, response_length=250)  # verl's default: 1
    assert slow.calls == 1 and out.meta["metrics"]["tool_calls_skipped/sum"] == 2
    assert text(segments(out, 0)[1][1]).count("<|im_start|> tool") == 1, "one result message for the one call run"
    slow = SlowTool(0.0)
    run(scripts, tools={"reverse": slow}, response_length=250, max_parallel_calls=2)
    assert slow.calls == 2


def test_tool_response_truncation_sides():
    from rlkit.rollout.agent.loop import truncate_text

    body = "abcdefghij"
    assert truncate_text(body, 10, "middle") == body
    assert truncate_text(body, 4, "left") == "abcd...(truncated)"
    assert truncate_text(body, 4, "right") == "(truncated)...ghij"
    assert truncate_text(body, 4, "middle") == "ab...(truncated)...ij"
    loop = AgentLoop(ScriptedEngine(TOK, {}), TOK, MultiTurnConfig(max_tool_response_length=4,
                                                                   tool_response_truncate_side="right"),
                     {}, HermesParser())
    assert loop._clip(body) == "(truncated)...ghij"
    assert MultiTurnConfig().max_tool_response_length == 256  # verl's default, in characters as verl counts


def test_verl_layout_tools_kwargs_from_extra_info():
    """verl's datasets keep tools_kwargs in extra_info, as {create_kwargs: {..}, execute_kwargs: {..}}."""
    slow = SlowTool(0.0)
    extra = [{"tools_kwargs": {"reverse": {"create_kwargs": {"ground_truth": "5"}, "execute_kwargs": {"k": 1}}}}]
    prompts = make_prompts(1, extra_info=extra)
    run({0: [call("reverse"), "#### 1"]}, tools={"reverse": slow}, prompts=prompts)
    assert slow.kwargs == [{"ground_truth": "5", "k": 1}]
    slow = SlowTool(0.0)  # a tools_kwargs column wins over extra_info, rlkit's flat layout as it is
    prompts = make_prompts(1, extra_info=extra, tools_kwargs=[{"reverse": {"preamble": "x"}}])
    run({0: [call("reverse"), "#### 1"]}, tools={"reverse": slow}, prompts=prompts)
    assert slow.kwargs == [{"preamble": "x"}]
