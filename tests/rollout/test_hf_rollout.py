"""The `hf` backend: layout, stop handling, determinism, log-probs, weight sync."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlkit.models.model_info import WeightNames, special_token_ids
from rlkit.rollout import HFRollout, RolloutConfig
from tests.rollout.helpers import check_layout, make_prompts, perturbed_state, reference_log_probs

R = 16
LOGPROB_TOL = 1e-4  # float32, KV-cache decode vs one full forward: observed ~2e-6


@pytest.fixture(scope="module")
def config():
    return RolloutConfig(prompt_length=32, response_length=R, calculate_log_probs=True, max_num_seqs=64)


@pytest.fixture(scope="module")
def hf(model_path, config):
    return HFRollout(model_path, config)


@pytest.fixture(scope="module")
def ref_model(model_path):
    return AutoModelForCausalLM.from_pretrained(model_path).eval()


def test_layout_greedy_and_sampled(hf, config, prompts):
    for sampling in (config.to_sampling(greedy=True), config.to_sampling()):
        out = hf.generate(prompts, sampling)
        check_layout(out, prompts, R, hf.stop_ids, hf.pad_id)
        assert out["rollout_log_probs"].dtype == torch.float32
        assert torch.isfinite(out["rollout_log_probs"]).all()
    no_lp = dataclasses.replace(config.to_sampling(), calculate_log_probs=False)
    assert "rollout_log_probs" not in hf.generate(prompts, no_lp)


def test_greedy_is_deterministic_and_microbatch_invariant(model_path, hf, config, prompts):
    greedy = config.to_sampling(greedy=True)
    first = hf.generate(prompts, greedy)
    assert torch.equal(first["responses"], hf.generate(prompts, greedy)["responses"])
    one_by_one = HFRollout(model_path, dataclasses.replace(config, max_num_seqs=1))
    assert torch.equal(first["responses"], one_by_one.generate(prompts, greedy)["responses"])


def test_n_rows_give_n_responses_and_seed_reproduces(hf, config, prompts):
    repeated = prompts.repeat(3)
    sampling = dataclasses.replace(config.to_sampling(), seed=123)
    rng_before = torch.get_rng_state()
    out = hf.generate(repeated, sampling)
    assert torch.equal(torch.get_rng_state(), rng_before), "the caller's RNG must not move"
    assert len(out) == 3 * len(prompts)
    assert out.non_tensors["uid"].tolist() == [u for u in prompts.non_tensors["uid"] for _ in range(3)]
    first = out["responses"][0::3]
    assert not torch.equal(first, out["responses"][1::3]), "samples of one prompt should differ"
    assert torch.equal(out["responses"], hf.generate(repeated, sampling)["responses"])
    unseeded = config.to_sampling()
    assert not torch.equal(hf.generate(repeated, unseeded)["responses"], hf.generate(repeated, unseeded)["responses"])


def test_stop_token_from_sampling_config(hf, config, prompts):
    greedy = config.to_sampling(greedy=True)
    base = hf.generate(prompts, greedy)["responses"]
    row = base[0].tolist()
    pos = next(i for i in range(2, R) if row[i] not in row[:i])
    stop = row[pos]
    out = hf.generate(prompts, dataclasses.replace(greedy, stop_token_ids=[stop]))
    check_layout(out, prompts, R, [stop, *hf.stop_ids], hf.pad_id)
    assert int(out["response_mask"][0].sum()) == pos + 1
    assert out["responses"][0, pos] == stop and (out["responses"][0, pos + 1 :] == hf.pad_id).all()


def test_generation_config_eos_is_a_stop_token(model_path, hf, config, prompts, tmp_path):
    greedy = config.to_sampling(greedy=True)
    row = hf.generate(prompts, greedy)["responses"][1].tolist()
    stop = row[3] if row[3] not in row[:3] else row[0]
    folder = tmp_path / "eos"
    shutil.copytree(model_path, folder)
    gen_cfg = json.loads((folder / "generation_config.json").read_text())
    gen_cfg["eos_token_id"] = [gen_cfg["eos_token_id"], stop]
    (folder / "generation_config.json").write_text(json.dumps(gen_cfg))
    stops, pad = special_token_ids(folder)
    assert stops == [hf.stop_ids[0], stop] and pad == hf.pad_id
    out = HFRollout(folder, config).generate(prompts, greedy)
    check_layout(out, prompts, R, stops, pad)
    assert out["responses"][1, row.index(stop)] == stop and int(out["response_mask"][1].sum()) == row.index(stop) + 1


@pytest.mark.parametrize("temperature, top_k", [(1.0, -1), (0.7, 20), (0.0, -1)])
def test_log_probs_match_a_forward_pass(hf, ref_model, config, prompts, temperature, top_k):
    sampling = dataclasses.replace(config.to_sampling(), temperature=temperature, top_k=top_k)
    batch = prompts.repeat(4)
    out = hf.generate(batch, sampling)
    ref = reference_log_probs(ref_model, out, temperature=temperature or 1.0, top_k=top_k)
    torch.testing.assert_close(out["rollout_log_probs"], ref, atol=LOGPROB_TOL, rtol=0)


def test_update_weights_matches_a_fresh_model(model_path, config, prompts, ref_model, tmp_path):
    hf = HFRollout(model_path, config)
    greedy = config.to_sampling(greedy=True)
    before = hf.generate(prompts, greedy)["responses"]
    new_state = perturbed_state(ref_model)
    nbytes = hf.update_weights(iter(new_state.items()))
    assert nbytes == sum(t.numel() * t.element_size() for t in new_state.values())
    assert hf.last_update["tensors"] == len(new_state) and hf.last_update["seconds"] >= 0
    after = hf.generate(prompts, greedy)
    assert not torch.equal(before, after["responses"]), "a sync that changed nothing"
    fresh_model = AutoModelForCausalLM.from_pretrained(model_path)
    fresh_model.load_state_dict(new_state)
    fresh_model.save_pretrained(tmp_path / "perturbed")
    shutil.copy(model_path / "tokenizer.json", tmp_path / "perturbed")
    shutil.copy(model_path / "tokenizer_config.json", tmp_path / "perturbed")
    fresh = HFRollout(tmp_path / "perturbed", config).generate(prompts, greedy)
    assert torch.equal(after["responses"], fresh["responses"])
    torch.testing.assert_close(after["rollout_log_probs"], fresh["rollout_log_probs"], atol=1e-6, rtol=0)


def test_update_weights_is_strict(model_path, config, ref_model):
    hf = HFRollout(model_path, config)
    state = ref_model.state_dict()
    with pytest.raises(ValueError, match="unknown names.*not.a.weight"):
        hf.update_weights([*state.items(), ("not.a.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="1 missing names.*lm_head.weight"):
        hf.update_weights((k, v) for k, v in state.items() if k != "lm_head.weight")
    with pytest.raises(ValueError, match="wrong shapes.*lm_head.weight"):
        hf.update_weights({**state, "lm_head.weight": state["lm_head.weight"][:-1]}.items())
    assert hf.update_weights(state.items()) > 0


def test_tied_embeddings_need_only_one_name():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True)
    names = WeightNames(LlamaForCausalLM(cfg))
    assert ["model.embed_tokens.weight", "lm_head.weight"] in names.groups
    stream = names.stream((n, torch.zeros(s)) for n, s in names.shapes.items() if n != "lm_head.weight")
    list(stream)
    assert stream.finish()["tensors"] == len(names.shapes) - 1


def test_memory_report(hf):
    assert hf.memory_report()["rss_bytes"] > 10 << 20


def test_micro_batches_with_uneven_padding(hf, config):
    prompts = make_prompts(["1", "copy the digits : 1 2 3 4 5 6 7 8 9", "2 + 2 =", "reverse"])
    greedy = config.to_sampling(greedy=True)
    together = hf.generate(prompts, greedy)
    alone = [hf.generate(make_prompts([t]), greedy)["responses"][0] for t in ["1", "reverse"]]
    assert torch.equal(together["responses"][0], alone[0]) and torch.equal(together["responses"][3], alone[1])
