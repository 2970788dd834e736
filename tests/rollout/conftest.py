"""Fixtures shared by the rollout tests: one tiny model folder per session."""

from __future__ import annotations

import pytest

from tests.rollout.helpers import make_prompts, save_test_model


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    return save_test_model(tmp_path_factory.mktemp("rollout") / "tiny")


@pytest.fixture
def prompts():
    return make_prompts()
