"""The vLLM judge's `gpu_memory_utilization` on a GPU it shares with the trainer's workers (issue 49, item 7): its
own need as a share of the device, never more than is free, nothing on CPU. CUDA is mocked (no GPU here)."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.judge import JudgeConfig
from rlkit.errors import UserError
from rlkit.reward.judge_backends import (
    JUDGE_HEADROOM_BYTES,
    VLLMJudgeBackend,
    judge_gpu_share,
    model_weight_bytes,
)

GIB = 2**30


def test_share_is_the_need_not_vllms_default():
    # a 1 GiB judge + 2 GiB headroom on an idle 141 GiB H200: ~3%, not 90%
    assert judge_gpu_share(3 * GIB, 140 * GIB, 141 * GIB) == 0.03


def test_share_never_exceeds_what_is_free():
    # workers hold most of the device: the share is capped at the free fraction, so vLLM's check passes
    share = judge_gpu_share(int(9.99 * GIB), 10 * GIB, 100 * GIB)
    assert share == 0.1 and share * 100 * GIB <= 10 * GIB


def test_too_little_free_is_one_line_naming_the_keys():
    with pytest.raises(UserError, match=r"reward_model\.judge\.kv_cache_memory_bytes.*http backend"):
        judge_gpu_share(12 * GIB, 10 * GIB, 100 * GIB)


def test_weight_bytes_from_the_folder(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert model_weight_bytes(str(tmp_path), "auto") == 1000
    assert model_weight_bytes(str(tmp_path), "float32") == 2000
    assert model_weight_bytes(str(tmp_path / "absent"), "auto") == 0


def test_engine_kwargs_on_cpu_leave_vllm_alone(tmp_path):
    kwargs = VLLMJudgeBackend.engine_kwargs(JudgeConfig(backend="vllm", model=str(tmp_path)))
    assert not torch.cuda.is_available() and "gpu_memory_utilization" not in kwargs


def test_engine_kwargs_on_a_shared_gpu(tmp_path, monkeypatch):
    with open(tmp_path / "model.safetensors", "wb") as f:  # 512 MiB, sparse
        f.truncate(GIB // 2)
    cfg = JudgeConfig(backend="vllm", model=str(tmp_path), kv_cache_memory_bytes=GIB // 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (40 * GIB, 100 * GIB))  # workers hold 60%
    share = VLLMJudgeBackend.engine_kwargs(cfg)["gpu_memory_utilization"]
    assert share == 0.03  # (0.5 GiB weights + 0.5 GiB KV + 2 GiB headroom) of 100 GiB
    assert JUDGE_HEADROOM_BYTES == 2 * GIB
