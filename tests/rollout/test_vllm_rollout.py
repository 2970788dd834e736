"""The `vllm` backend against the `hf` reference, on the tiny model in float32 (one shared engine)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM  # noqa: E402

from rlkit.rollout import HFRollout, VLLMRollout  # noqa: E402
from tests.rollout.helpers import (  # noqa: E402
    VLLM_RESPONSE_LENGTH,
    check_layout,
    perturbed_state,
    reference_log_probs,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]

R = VLLM_RESPONSE_LENGTH
# vLLM's CPU attention/GEMM kernels vs one transformers forward, float32: observed ~1e-6.
LOGPROB_TOL = 1e-4
RSS_GROWTH_LIMIT = 64 << 20  # 10 sleep/wake/generate cycles


@pytest.fixture(scope="module")
def config(vllm_config):
    return vllm_config


@pytest.fixture(scope="module")
def engine(vllm_engine):
    return vllm_engine


@pytest.fixture(scope="module")
def hf(model_path, config):
    return HFRollout(model_path, config)


@pytest.fixture(scope="module")
def ref_model(model_path):
    return AutoModelForCausalLM.from_pretrained(model_path).eval()


def test_engine_keys_reach_the_engine(engine, config):
    """The rollout's engine keys and `engine_kwargs.vllm`, read back from the running engine's own config."""
    llm = engine.llm.llm_engine
    vc = llm.vllm_config
    assert vc.scheduler_config.enable_chunked_prefill is config.enable_chunked_prefill is False
    assert vc.cache_config.enable_prefix_caching is config.enable_prefix_caching is True
    assert vc.model_config.enforce_eager is config.enforce_eager
    assert llm.log_stats is (not config.disable_log_stats)
    assert config.load_format == "dummy" and vc.load_config.load_format == "auto"  # rlkit starts from the folder
    assert vc.model_config.max_logprobs == 5  # engine_kwargs.vllm
    assert vc.model_config.logprobs_mode == "processed_logprobs"


def test_layout_and_log_probs(engine, ref_model, config, prompts):
    batch = prompts.repeat(4)
    for temperature, top_k in ((1.0, -1), (0.7, 20), (0.0, -1)):
        sampling = dataclasses.replace(config.to_sampling(), temperature=temperature, top_k=top_k)
        out = engine.generate(batch, sampling)
        check_layout(out, batch, R, engine.stop_ids, engine.pad_id)
        ref = reference_log_probs(ref_model, out, temperature=temperature or 1.0, top_k=top_k)
        torch.testing.assert_close(out["rollout_log_probs"], ref, atol=LOGPROB_TOL, rtol=0)
    no_lp = dataclasses.replace(config.to_sampling(), calculate_log_probs=False)
    assert "rollout_log_probs" not in engine.generate(prompts, no_lp)


def test_greedy_equals_hf_greedy(engine, hf, config, prompts):
    greedy = config.to_sampling(greedy=True)
    ours, ref = engine.generate(prompts, greedy), hf.generate(prompts, greedy)
    assert torch.equal(ours["responses"], ref["responses"])
    assert torch.equal(ours["response_mask"], ref["response_mask"])
    torch.testing.assert_close(ours["rollout_log_probs"], ref["rollout_log_probs"], atol=LOGPROB_TOL, rtol=0)


def test_stop_tokens_and_seeds(engine, hf, config, prompts):
    greedy = config.to_sampling(greedy=True)
    row = engine.generate(prompts, greedy)["responses"][0].tolist()
    pos = next(i for i in range(2, R) if row[i] not in row[:i])
    stopped = dataclasses.replace(greedy, stop_token_ids=[row[pos]])
    out = engine.generate(prompts, stopped)
    check_layout(out, prompts, R, [row[pos], *engine.stop_ids], engine.pad_id)
    assert int(out["response_mask"][0].sum()) == pos + 1
    assert torch.equal(out["responses"], hf.generate(prompts, stopped)["responses"])

    seeded = dataclasses.replace(config.to_sampling(), seed=7)
    batch = prompts.repeat(2)
    first = engine.generate(batch, seeded)["responses"]
    assert torch.equal(first, engine.generate(batch, seeded)["responses"])
    assert not torch.equal(first[0::2], first[1::2]), "each row gets its own seed"


def test_ignore_eos_runs_every_row_to_the_full_length(engine, hf, config, prompts, monkeypatch):
    """rollout.ignore_eos: the model's EOS ids no longer stop a row (vLLM also ignores its tokenizer's EOS); a
    token that greedy decoding produces stands in for the EOS here, as the random model rarely samples its own."""
    greedy = config.to_sampling(greedy=True)
    plain = engine.generate(prompts, greedy)
    row = plain["responses"][0].tolist()
    pos = next(i for i in range(2, R) if row[i] not in row[:i])
    for backend in (engine, hf):
        monkeypatch.setattr(backend, "stop_ids", [row[pos]])
    stopped = engine.generate(prompts, greedy)
    assert int(stopped["response_mask"][0].sum()) == pos + 1, "the stand-in EOS stops a row by default"

    full = dataclasses.replace(greedy, ignore_eos=True)
    out = engine.generate(prompts, full)
    assert bool(out["response_mask"].bool().all()), "every row runs to response_length"
    kept = plain["response_mask"].bool()
    assert torch.equal(out["responses"][kept], plain["responses"][kept])
    ref = hf.generate(prompts, full)
    assert torch.equal(out["responses"], ref["responses"])
    assert bool(ref["response_mask"].bool().all())


def test_update_weights_matches_a_fresh_engine(engine, model_path, config, prompts, ref_model, tmp_path):
    greedy = config.to_sampling(greedy=True)
    before = engine.generate(prompts, greedy)
    original = {k: v.clone() for k, v in ref_model.state_dict().items()}
    new_state = perturbed_state(ref_model)
    nbytes = engine.update_weights(iter(new_state.items()))
    assert nbytes == sum(t.numel() * t.element_size() for t in new_state.values())
    synced = engine.generate(prompts, greedy)
    assert not torch.equal(before["responses"], synced["responses"]), "a sync that changed nothing"

    folder = tmp_path / "perturbed"
    shutil.copytree(model_path, folder)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.load_state_dict(new_state)
    model.save_pretrained(folder)
    rng = torch.get_rng_state()
    fresh = VLLMRollout(folder, config)
    assert torch.equal(rng, torch.get_rng_state()), "engine start-up must not reseed the caller's RNG"
    try:
        expected = fresh.generate(prompts, greedy)
    finally:
        fresh.close()
    assert torch.equal(synced["responses"], expected["responses"])
    torch.testing.assert_close(synced["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-5, rtol=0)

    engine.update_weights(original.items())
    assert torch.equal(engine.generate(prompts, greedy)["responses"], before["responses"])


def test_update_weights_is_strict(engine, config, prompts, ref_model):
    greedy = config.to_sampling(greedy=True)
    before = engine.generate(prompts, greedy)["responses"]
    with pytest.raises(ValueError, match=r"unknown names.*model\.layers\.9"):
        engine.update_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(3))])
    # nothing valid arrived: the engine still holds its weights
    assert torch.equal(engine.generate(prompts, greedy)["responses"], before)
    state = ref_model.state_dict()
    with pytest.raises(ValueError, match="wrong shapes"):
        engine.update_weights({**state, "lm_head.weight": state["lm_head.weight"][:-1]}.items())
    engine.update_weights(state.items())
    assert torch.equal(engine.generate(prompts, greedy)["responses"], before)


def test_sleep_wake_cycles_do_not_grow_memory(engine, config, prompts):
    sampling = config.to_sampling()
    engine.generate(prompts, sampling)  # warm allocator
    start = engine.memory_report()["rss_bytes"]
    for _ in range(10):
        engine.sleep()
        assert engine.sleeping
        engine.wake_up()
        out = engine.generate(prompts, sampling)
        assert len(out) == len(prompts)
    growth = engine.memory_report()["rss_bytes"] - start
    assert growth < RSS_GROWTH_LIMIT, f"RSS grew by {growth / 2**20:.1f} MiB over 10 cycles"


def test_a_sleeping_engine_refuses_to_generate_or_load(engine, config, prompts, ref_model):
    """Only EngineLifecycle wakes the engine: a generate on a sleeping engine would wait on vLLM's paused
    scheduler forever, and (on GPU) a load into sleeping weights would be lost."""
    greedy = config.to_sampling(greedy=True)
    before = engine.generate(prompts, greedy)["responses"]
    engine.sleep()
    try:
        with pytest.raises(RuntimeError, match=r"generate on a sleeping engine \(kv_cache, weights asleep\)"):
            engine.generate(prompts, greedy)
        with pytest.raises(RuntimeError, match="whose weights sleep would be lost"):
            engine.update_weights(ref_model.state_dict().items())
        engine.wake_up(["weights"])
        with pytest.raises(RuntimeError, match=r"sleeping engine \(kv_cache asleep\)"):
            engine.generate(prompts, greedy)
    finally:
        engine.wake_up()
    assert not engine.sleeping
    assert torch.equal(engine.generate(prompts, greedy)["responses"], before)


def test_sleep_frees_the_cpu_kv_cache(engine, config, prompts):
    """vLLM's CPU worker ignores sleep; rlkit frees the KV cache storages itself (vllm_compat.py) and
    allocates them again on wake: zero bytes while asleep, the same greedy output after."""
    greedy = config.to_sampling(greedy=True)
    before = engine.generate(prompts, greedy)["responses"]
    runner = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner
    sizes = {t.untyped_storage().nbytes() for t in runner.kv_caches}
    assert sizes and min(sizes) > 0
    engine.sleep()
    try:
        assert {t.untyped_storage().nbytes() for t in runner.kv_caches} == {0}
    finally:
        engine.wake_up()
    assert {t.untyped_storage().nbytes() for t in runner.kv_caches} == sizes
    assert torch.equal(engine.generate(prompts, greedy)["responses"], before)


def test_sleep_level_2_frees_the_cpu_weights_and_a_load_brings_them_back(engine, config, prompts, ref_model):
    """vLLM's CPU worker ignores sleep levels; at level 2 rlkit drops the packed GEMM operands and empties the
    parameter storages (vllm_compat.release_weights): `memory/rollout/weights_gb` is 0 and the RSS falls while
    asleep; after waking, a full load rebuilds them and the engine samples exactly as before."""
    greedy = config.to_sampling(greedy=True)
    engine.update_weights(ref_model.state_dict().items())
    before = engine.generate(prompts, greedy)["responses"]
    awake = engine.memory_parts()
    itemsize = getattr(torch, engine.dtype).itemsize
    assert awake["weights_gb"] == pytest.approx(sum(p.numel() for p in ref_model.parameters()) * itemsize / 2**30)
    assert awake["kv_cache_gb"] > 0
    model = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    engine.sleep(1)
    assert engine.memory_parts() == {"weights_gb": awake["weights_gb"], "kv_cache_gb": 0.0}  # level 1 keeps them
    engine.wake_up()
    engine.sleep(2)
    try:
        assert engine.memory_parts() == {"weights_gb": 0.0, "kv_cache_gb": 0.0}
        assert {p.untyped_storage().nbytes() for p in model.parameters()} == {0}
        engine.wake_up(["weights"])
        assert min(p.untyped_storage().nbytes() for p in model.parameters() if p.numel()) > 0
        engine.update_weights(ref_model.state_dict().items())
    finally:
        engine.wake_up()
    assert torch.equal(engine.generate(prompts, greedy)["responses"], before)
