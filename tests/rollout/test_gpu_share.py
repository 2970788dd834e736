"""The colocated engine's GPU share fitted to the free memory at its start (docs/gpu.md, defect 6 c)."""

from __future__ import annotations

import logging

import pytest

from rlkit.errors import UserError
from rlkit.rollout.gpu_share import KEY, fit_gpu_share

GIB = 2**30


def test_the_requested_share_is_kept_when_it_is_free():
    assert fit_gpu_share(0.5, free_bytes=100 * GIB, total_bytes=140 * GIB) == 0.5


def test_less_free_than_asked_starts_with_the_free_share_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        share = fit_gpu_share(0.5, free_bytes=56 * GIB, total_bytes=140 * GIB)  # 0.40 free
    assert share == pytest.approx(0.38)
    assert share * 140 * GIB < 56 * GIB  # vLLM's start check (free >= share x total) passes
    assert KEY in caplog.text


def test_almost_nothing_free_is_one_line_naming_the_key_and_the_fix():
    with pytest.raises(UserError, match="param_offload") as err:
        fit_gpu_share(0.5, free_bytes=5 * GIB, total_bytes=140 * GIB)
    assert KEY in str(err.value)
