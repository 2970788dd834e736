"""The agent loop on a real engine (HF backend; vLLM when installed, slow) with the tiny Llama.

The first turn of each sample is a planned tool call (a random tiny model does not write
valid calls); every later turn is the real model continuing after the tool's answer. The
model's log-probs in those turns, recomputed by one forward pass over the final sequence,
match what the engine reported: the context the engine saw turn by turn is exactly the
sequence the trainer will score (token-in/token-out, nothing re-tokenised).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.data.collation import collate
from rlkit.rollout import HFRollout, RolloutConfig
from rlkit.rollout.agent.engine import TurnOutput, TurnRequest
from rlkit.rollout.agent_rollout import AgentRollout
from rlkit.testing import build_tiny_tokenizer, save_tiny_model
from tests.rollout.agent.scripted import call

P, R = 192, 40
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("agent") / "tiny", heads=2)  # head_dim 32 for vLLM's CPU kernels


def prompts(tok, n):
    msgs = [[{"role": "user", "content": f"what is {i} + {i} ?"}] for i in range(n)]
    rows = [{"input_ids": [1], "raw_prompt": m, "uid": f"u{i}"} for i, m in enumerate(msgs)]
    return collate(rows, P, tok.pad_token_id)


class FirstTurnPlanned:
    """Wraps the batching server: turn 0 returns a planned calculator call, later turns go to the engine."""

    def __init__(self, server, tok):
        self.server, self.stop_ids, self.stats = server, server.stop_ids, server.stats
        self.planned = tok(call("calculator", expression="2 + 3"), add_special_tokens=False)["input_ids"]
        self.planned.append(tok.eos_token_id)

    def session(self):
        return self.server.session()

    async def aclose(self):
        await self.server.aclose()

    async def generate(self, req: TurnRequest) -> TurnOutput:
        if req.turn == 0:
            return TurnOutput(self.planned, [0.0] * len(self.planned), stopped=True)
        return await self.server.generate(req)


def run_agent(backend, config, tok, n=4, monkeypatch=None):
    import rlkit.rollout.agent_rollout as ar

    agent = AgentRollout(backend, tok, config)
    real_loop = ar.AgentLoop
    monkeypatch.setattr(ar, "AgentLoop", lambda server, *a, **k: real_loop(FirstTurnPlanned(server, tok), *a, **k))
    out = agent.generate(prompts(tok, n), config.to_sampling())
    return agent, out


def check_against_forward(model_path, out, planned_len):
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                       position_ids=out["position_ids"]).logits.float()
    lp = torch.log_softmax(logits[:, P - 1 : -1], dim=-1).gather(-1, out["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out["response_mask"].bool().clone()
    mask[:, :planned_len] = False  # the planned first turn did not come from the model
    assert mask.any(), "the model generated after the tool answer"
    diff = (lp - out["rollout_log_probs"]).abs()[mask]
    assert float(diff.max()) < LOGPROB_TOL


def check_structure(out, tok, planned_len):
    for i in range(len(out)):
        valid = int(out["attention_mask"][i, P:].sum())
        mask = out["response_mask"][i, :valid].tolist()
        assert mask[:planned_len] == [1] * planned_len
        tool = out["responses"][i, planned_len : planned_len + mask[planned_len:].index(1)].tolist()
        assert tok.decode(tool) == "<|im_start|> tool 5 <|im_end|> <|im_start|> assistant"
        assert out["agent/num_turns"][i] >= 2 and out["agent/tool_calls"][i] >= 1
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))
    metrics = out.meta["metrics"]
    for key in ("num_turns/mean", "num_turns/max", "tool_calls/mean", "tool_errors/sum", "agent/in_flight/max"):
        assert key in metrics
    assert metrics["agent/in_flight/max"] == len(out)


def make_config(name):
    return RolloutConfig(
        name=name, prompt_length=P, response_length=R, calculate_log_probs=True, kv_cache_memory_mb=32,
        multi_turn={"enable": True, "tools": ["calculator"], "max_turns": 3},
    )


def test_hf_engine_agent_loop(model_path, monkeypatch):
    tok = build_tiny_tokenizer()
    config = make_config("hf")
    agent, out = run_agent(HFRollout(model_path, config), config, tok, monkeypatch=monkeypatch)
    planned_len = len(tok(call("calculator", expression="2 + 3"), add_special_tokens=False)["input_ids"]) + 1
    check_structure(out, tok, planned_len)
    check_against_forward(model_path, out, planned_len)
    assert agent.last_stats["agent/batch_size/max"] == 4, "the four continuations were batched together"


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_vllm_engine_agent_loop(model_path, monkeypatch):
    pytest.importorskip("vllm")
    from rlkit.rollout import VLLMRollout

    tok = build_tiny_tokenizer()
    config = make_config("vllm")
    set_num_threads = torch.set_num_threads
    engine = VLLMRollout(model_path, config)
    try:
        agent, out = run_agent(engine, config, tok, monkeypatch=monkeypatch)
        planned_len = len(tok(call("calculator", expression="2 + 3"), add_special_tokens=False)["input_ids"]) + 1
        check_structure(out, tok, planned_len)
        check_against_forward(model_path, out, planned_len)
    finally:
        engine.close()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        with contextlib.suppress(Exception):
            cleanup_dist_env_and_memory()
        torch.set_num_threads = set_num_threads
