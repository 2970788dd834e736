"""The rollout source seam without Ray: the prompt stream's look-ahead, the registry, the config -> source choice."""

from __future__ import annotations

import types

import pytest

from rlkit.data.prompt_stream import PromptStream
from rlkit.trainer.step.rl_trainer import ROLLOUT_SOURCES, SOURCES
from rlkit.trainer.step.rollout_source import source_name


def test_the_stream_cycles_epochs_and_peek_returns_what_next_returns():
    stream = PromptStream([1, 2, 3])
    assert [next(stream), next(stream)] == [1, 2]
    assert stream.peek() == 3 and stream.peek() == 3  # fetched once
    assert [next(stream), next(stream), next(stream)] == [3, 1, 2]  # the next epoch follows


@pytest.mark.parametrize(
    ("fully_async", "one_step_off", "name"),
    [(False, False, "sync"), (False, True, "one_step_off"), (True, False, "fully_async")],
)
def test_the_config_picks_a_registered_source(fully_async, one_step_off, name):
    trainer = types.SimpleNamespace(fully_async=fully_async, one_step_off_policy=one_step_off)
    cfg = types.SimpleNamespace(trainer=trainer)
    assert source_name(cfg) == name
    assert ROLLOUT_SOURCES.get(name) in SOURCES
    assert set(ROLLOUT_SOURCES) == {"sync", "one_step_off", "fully_async"}
