"""`rollout.sleep_level: null` (`default_sleep_level`): level 2 exactly where the engine's level 2 drops its
weights and the colocated actor reloads all of them before every generation (issue 49, defect 6).

The engines are `VLLMRollout` objects whose device facts are set by hand (no vLLM engine is built: the decision
reads only `on_cpu` and `cpu_drops_weights`, through the real `discards_weights`), and the HF rollout,
which never discards (the base class's answer)."""

from __future__ import annotations

import pytest
import torch

from rlkit.rollout.hf_rollout import HFRollout
from rlkit.rollout.lifecycle import ActorAdapter, ActorWeights, StateDictWeights, default_sleep_level
from rlkit.rollout.vllm_rollout import VLLMRollout


def _vllm(*, on_cpu: bool, cpu_drops_weights: bool) -> VLLMRollout:
    engine = VLLMRollout.__new__(VLLMRollout)  # the decision's inputs only: building an engine needs vLLM
    engine.on_cpu, engine.cpu_drops_weights = on_cpu, cpu_drops_weights
    return engine


ACTOR = ActorWeights(actor=None)


def test_gpu_engine_fed_by_the_actor_discards_its_weights():
    # on GPU level 1 would pin a bf16 copy in host RAM and copy it both ways each step, only to be overwritten
    assert default_sleep_level(_vllm(on_cpu=False, cpu_drops_weights=False), ACTOR) == 2


@pytest.mark.parametrize("drops, level", [(True, 2), (False, 1)])
def test_cpu_engine_unchanged(drops, level):
    # vLLM-cpu: 2 only where rlkit's release really drops the weights (dense, no LoRA), as before
    assert default_sleep_level(_vllm(on_cpu=True, cpu_drops_weights=drops), ACTOR) == level


@pytest.mark.parametrize("source", [StateDictWeights(state={"w": torch.zeros(1)}), ActorAdapter(actor=None), None])
def test_other_sources_keep_level_1(source):
    # the separate layout's engine and LoRA's native sync have nothing to reload discarded base weights from
    assert default_sleep_level(_vllm(on_cpu=False, cpu_drops_weights=False), source) == 1


def test_engine_that_never_discards_keeps_level_1():
    engine = HFRollout.__new__(HFRollout)  # the base class's discards_weights: never
    assert not engine.discards_weights(2)
    assert default_sleep_level(engine, ACTOR) == 1
