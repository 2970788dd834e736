"""The classifier RM worker scores what a plain transformers forward scores, on the same texts.

The worker batches rows (right-padded micro-batches), reads the score at each row's last token from the
per-token head, and either reads the policy's tokens as they are or re-templates them for the RM's own
tokenizer. The reference is `AutoModelForSequenceClassification` on one unpadded row at a time. Tolerance
1e-5 (float32 on CPU; padding only adds masked columns, measured ~1e-7).
"""

from __future__ import annotations

import pytest
import torch

from rlkit.config.reward_model import RewardModelConfig, RewardModelModelConfig
from rlkit.config.schema import FSDPConfig
from rlkit.reward.rm_inputs import pack, policy_token_rows, truncate_left
from rlkit.testing import build_tiny_tokenizer, save_tiny_model
from rlkit.workers.reward_model import RewardModelWorker
from tests.reward.rm_helpers import build_other_tokenizer, plain_scores, policy_batch, save_rm

PROMPTS = ["copy the digits : 7", "copy the digits : 1 2", "what is 3 + 4 ?", "reverse the digits : 9 8 7"]
RESPONSES = ["7", "1 2", "the answer is 7", "7 8"]


def worker(rm_path, input_tokenizer=None, micro=3, max_length=None, **fsdp) -> RewardModelWorker:
    cfg = RewardModelConfig(
        enable=True,
        micro_batch_size_per_gpu=micro,
        max_length=max_length,
        model=RewardModelModelConfig(path=str(rm_path), input_tokenizer=input_tokenizer,
                                     fsdp_config=FSDPConfig(**fsdp)),
    )
    w = RewardModelWorker(cfg)
    w.init_model()
    return w


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("policy") / "policy")


def test_same_tokenizer_matches_plain_forward(tmp_path, process_group):
    rm = save_rm(tmp_path / "rm")
    batch = policy_batch(PROMPTS, RESPONSES)
    out = worker(rm).compute_rm_score(batch)
    rm_scores = out["rm_scores"]
    assert rm_scores.shape == batch["responses"].shape and rm_scores.dtype == torch.float32
    # the score sits on the last valid response token (the EOS), nowhere else
    last = batch["response_mask"].sum(-1) - 1
    assert torch.equal(rm_scores.nonzero()[:, 1], last)
    tok = build_tiny_tokenizer()
    rows = []
    for msgs, resp in zip(batch["raw_prompt"], RESPONSES):
        prompt = tok.apply_chat_template(list(msgs), tokenize=False, add_generation_prompt=True)
        rows.append(tok(prompt + resp, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    want = plain_scores(rm, rows)
    assert torch.allclose(rm_scores.sum(-1), want, atol=1e-5, rtol=0), (rm_scores.sum(-1), want)
    assert want.std() > 1e-3  # the rows score differently: a row mix-up would show
    assert "timing_s/compute_rm_score" in out.meta["metrics"]


def test_bf16_scores_are_fsdp2_mixed_precisions(tmp_path, process_group):
    """One bf16 RM worker scores on its compute copy (`FSDPModel.computing()` around the direct module call,
    rlkit/workers/compute_copy.py): the scores FSDP2's mixed precision gives (`shard_single_worker`), to the bit,
    and not float32's (the copy is really in bf16)."""
    rm = save_rm(tmp_path / "rm")
    batch = policy_batch(PROMPTS, RESPONSES)
    plain = worker(rm, param_dtype="bfloat16")
    assert plain.scorer.model.compute_copy is not None
    scores = plain.compute_rm_score(batch)["rm_scores"]
    fsdp = worker(rm, param_dtype="bfloat16", shard_single_worker=True)
    assert fsdp.scorer.model.compute_copy is None
    torch.testing.assert_close(scores, fsdp.compute_rm_score(batch)["rm_scores"], atol=0, rtol=0)
    fp32 = worker(rm, param_dtype="float32").compute_rm_score(batch)["rm_scores"]
    assert not torch.equal(scores, fp32)
    torch.testing.assert_close(scores, fp32, atol=0.05, rtol=0.05)


def test_other_tokenizer_and_template_are_retemplated(tmp_path, policy_dir, process_group):
    """The RM has its own vocabulary order and chat template: the worker decodes the policy's responses and
    renders prompt + response with the RM's template; the policy's ids fed as they are would score otherwise."""
    other = build_other_tokenizer()
    rm = save_rm(tmp_path / "rm_other", tokenizer=other, seed=1)
    batch = policy_batch(PROMPTS, RESPONSES)
    got = worker(rm, input_tokenizer=str(policy_dir)).compute_rm_score(batch)["rm_scores"].sum(-1)
    texts = [
        other.apply_chat_template([*msgs, {"role": "assistant", "content": r}], tokenize=False)
        for msgs, r in zip(batch["raw_prompt"], RESPONSES)
    ]
    assert texts[0].startswith("<s> [ user ] copy the digits : 7 </s> [ assistant ] 7 </s>")
    rows = [other(t, add_special_tokens=False)["input_ids"] for t in texts]
    want = plain_scores(rm, rows)
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got, want)
    as_is = plain_scores(rm, policy_token_rows(batch["input_ids"], batch["attention_mask"], batch["response_mask"]))
    assert (as_is - want).abs().max() > 1e-3  # the handmade case differs: re-templating is what made it equal


def test_max_length_keeps_the_last_tokens(tmp_path, process_group):
    rm = save_rm(tmp_path / "rm")
    batch = policy_batch(PROMPTS, RESPONSES)
    got = worker(rm, max_length=7, micro=8).compute_rm_score(batch)["rm_scores"].sum(-1)
    rows = policy_token_rows(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
    assert all(len(r) > 7 for r in rows)
    want = plain_scores(rm, [r[-7:] for r in rows])
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_rm_inputs_units():
    assert truncate_left([1, 2, 3, 4], 2) == [3, 4] and truncate_left([1, 2], None) == [1, 2]
    packed = pack([[5, 6, 7], [8]], pad_token_id=0)
    assert packed.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert packed.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert packed.last.tolist() == [2, 0]
    assert packed.rows(1, 2).input_ids.tolist() == [[8]]
    # a response without a valid token: the row ends at the prompt's last token
    ids = torch.tensor([[0, 4, 5, 9, 0], [4, 5, 6, 9, 9]])
    attn = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    resp_mask = torch.tensor([[0, 0], [1, 1]])
    assert policy_token_rows(ids, attn, resp_mask) == [[4, 5], [4, 5, 6, 9, 9]]


def test_missing_raw_prompt_is_a_clear_error(tmp_path, policy_dir, process_group):
    from rlkit.errors import UserError

    rm = save_rm(tmp_path / "rm")
    batch = policy_batch(PROMPTS[:1], RESPONSES[:1])
    batch.non_tensors.pop("raw_prompt")
    with pytest.raises(UserError, match="no raw_prompt"):
        worker(rm, input_tokenizer=str(policy_dir)).compute_rm_score(batch)


def test_two_labels_is_refused(tmp_path, process_group):
    from transformers import AutoConfig

    from rlkit.errors import UserError

    rm = save_rm(tmp_path / "rm")
    config = AutoConfig.from_pretrained(rm)
    config.num_labels = 2
    config.save_pretrained(rm)
    with pytest.raises(UserError, match="num_labels=2"):
        worker(rm)
