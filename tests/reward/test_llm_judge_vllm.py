"""The `vllm` judge backend: a tiny model in an in-process vLLM engine, greedy, with a deterministic user parser.

The judge's scores must equal what the same engine produces for the same prompts when driven directly
(chat template applied by the model folder's own tokenizer, greedy SamplingParams), and a prompt longer
than the engine's context must cost only its own sample.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("vllm")

from transformers import AutoTokenizer  # noqa: E402

from rlkit.config.judge import JudgeConfig  # noqa: E402
from rlkit.reward.judge_text import load_parser  # noqa: E402
from rlkit.reward.llm_judge import LLMJudge, judge_metrics  # noqa: E402
from tests.rollout.helpers import save_test_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]

TEMPLATE = "question {prompt} answer {response} reference {ground_truth} the answer is"
PARSER = '''
def digit_share(text):
    """Share of the judge's words that are digits; None when it wrote nothing."""
    words = text.split()
    return sum(w.isdigit() for w in words) / len(words) if words else None
'''
PROMPTS = ["copy the digits : 1 2 3", "reverse 4 5", "what is 2 + 2 ?", "think step by step : 7 * 8 ="]
RESPONSES = ["1 2 3", "5 4", "4", "5 6"]
TRUTHS = ["1 2 3", "5 4", "4", None]


def vllm_factory(engine_kwargs):
    """What a caller above the reward layer passes: rlkit's vLLM environment set-up, then the engine."""
    from rlkit.utils.vllm_env import prepare_vllm_env

    prepare_vllm_env()
    import vllm

    return vllm.LLM(**engine_kwargs)


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    import torch

    set_num_threads = torch.set_num_threads
    root = tmp_path_factory.mktemp("judge")
    model = save_test_model(root / "tiny-judge")
    parser = root / "parser.py"
    parser.write_text(PARSER)
    cfg = JudgeConfig(backend="vllm", model=str(model), template=TEMPLATE, parser=f"{parser}:digit_share",
                      max_tokens=12, temperature=0.0, dtype="float32", max_model_len=128,
                      kv_cache_memory_bytes=16 << 20, concurrency=8)  # fmt: skip
    start = time.monotonic()
    judge = LLMJudge(cfg, engine_factory=vllm_factory)
    judge.startup_s = time.monotonic() - start
    yield judge
    judge.close()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    torch.set_num_threads = set_num_threads  # vLLM makes it a no-op in its process


def direct_texts(judge: LLMJudge, rendered: list[str]) -> list[str]:
    """The same prompts through the engine without the judge: HF tokenizer's chat template, greedy."""
    from vllm import SamplingParams, TokensPrompt

    tok = AutoTokenizer.from_pretrained(judge.cfg.model)
    ids = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in rendered]
    ids = [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in ids]
    outs = judge.backend.llm.generate(
        [TokensPrompt(prompt_token_ids=x) for x in ids],
        SamplingParams(max_tokens=judge.cfg.max_tokens, temperature=0.0),
        use_tqdm=False,
    )
    return [o.outputs[0].text for o in outs]


def test_vllm_judge_scores_equal_the_engine_driven_directly(judge):
    start = time.monotonic()
    verdicts = judge.score(PROMPTS, RESPONSES, TRUTHS)
    score_s = time.monotonic() - start
    rendered = judge.render(PROMPTS, RESPONSES, TRUTHS)
    texts = direct_texts(judge, rendered)
    parser = load_parser(judge.cfg.parser)
    assert [v.raw for v in verdicts] == texts
    assert [v.score for v in verdicts] == [parser(t) for t in texts]
    assert all(v.error is None and t.split() for v, t in zip(verdicts, texts))
    assert len(set(texts)) > 1, "different judge prompts should give different verdicts"
    assert judge_metrics(verdicts)["reward/judge/errors"] == 0
    print(f"vllm judge: start-up {judge.startup_s:.1f}s, 4 verdicts in {score_s:.2f}s")
    # the same call again gives the same verdicts (greedy)
    assert [v.raw for v in judge.score(PROMPTS, RESPONSES, TRUTHS)] == texts


def test_vllm_judge_too_long_prompt_costs_only_its_sample(judge):
    long_response = " ".join(["1"] * 200)  # ~200 tokens > max_model_len 128
    verdicts = judge.score(PROMPTS[:2], [long_response, RESPONSES[1]], TRUTHS[:2])
    assert verdicts[0].score == 0.0 and verdicts[0].error.startswith("too long: ")
    assert "max_model_len 128" in verdicts[0].error
    assert verdicts[1].error is None
    assert verdicts[1].raw == judge.score(PROMPTS[1:2], RESPONSES[1:2], TRUTHS[1:2])[0].raw
