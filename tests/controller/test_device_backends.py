"""The process group a worker makes carries CPU tensors on every device (issue 49, defect 1).

NCCL takes CUDA tensors only, so on a GPU node every collective of a CPU tensor (the dynamic-batch count, the
loss-scale total, a debug flag, the clip norm of CPU-offloaded gradients) failed with "No backend type associated
with device type cpu" when the group was plain "nccl". CPU stand-in: a gloo backend registered for the `cuda`
device type only ("cuda:gloo") is such a group on a machine without a GPU: the old layout fails, the one workers
make now (`PROCESS_GROUP_BACKENDS["cuda"]`, NCCL swapped for gloo as no GPU is here) passes.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from rlkit.controller.worker import PROCESS_GROUP_BACKENDS, collective_device
from rlkit.protocol import Batch
from tests.gloo_workers import run_on_gloo_workers

NCCL_ONLY_STAND_IN = "cuda:gloo"  # what plain "nccl" is to CPU tensors: no backend for the cpu device type


def _batch(rank: int) -> Batch:
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[:, : rank + 1] = 0
    return Batch({"attention_mask": mask, "response_mask": mask[:, 3:]})


def _count_collectives(rank: int) -> None:
    from rlkit.workers.micro_batch import loss_scales, token_partitions

    parts = token_partitions(_batch(rank), max_tokens=5)
    assert sum(len(p) for p in parts) == 4
    scales = loss_scales([_batch(rank)["response_mask"]], "token-mean")
    assert len(scales) == 1 and scales[0] > 0


def _worker(rank: int, store_path: str, payload: None, results) -> None:
    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path + ".old", 2)
        dist.init_process_group(NCCL_ONLY_STAND_IN, store=store, rank=rank, world_size=2)
        try:  # the old code: its counts were CPU tensors, whatever the group
            dist.all_reduce(torch.tensor([3]), op=dist.ReduceOp.MAX)
            raise AssertionError("a CPU-tensor collective passed on a group without a cpu backend")
        except RuntimeError as exc:
            assert "No backend type associated with device type cpu" in str(exc), exc
        assert collective_device() == torch.device("cuda")  # now: a plain NCCL group gets its counts on the GPU
        dist.destroy_process_group()

        fixed = PROCESS_GROUP_BACKENDS["cuda"].replace("nccl", "gloo")  # the CUDA workers' layout, gloo for NCCL
        dist.init_process_group(fixed, store=dist.FileStore(store_path + ".new", 2), rank=rank, world_size=2)
        assert collective_device() == torch.device("cpu")
        _count_collectives(rank)
        dist.destroy_process_group()
        results.put((rank, "ok"))
    except BaseException as exc:  # reported to the parent, which asserts
        import traceback

        results.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"))


def test_cuda_workers_group_takes_cpu_tensors():
    assert PROCESS_GROUP_BACKENDS["cuda"].split(",")[0] == "cpu:gloo"
    assert PROCESS_GROUP_BACKENDS["cpu"] == "gloo"


def test_cpu_count_collectives_need_a_cpu_backend(tmp_path):
    run_on_gloo_workers(_worker, None, tmp_path, timeout_s=120)


def test_gpu_workers_local_rank_is_zero_cpu_workers_keep_their_slot(monkeypatch):
    """Defect 2: Ray shows a GPU actor one GPU, so its LOCAL_RANK is 0 whatever its slot on the node (vLLM's
    external launcher asserts LOCAL_RANK < the visible device count); a CPU worker keeps its slot."""
    from rlkit.controller.worker import Worker
    from rlkit.controller.worker_group import rank_env

    for slot in range(4):
        gpu = rank_env(4 + slot, 8, slot, 4, use_gpu=True)
        assert (gpu["LOCAL_RANK"], gpu["RLKIT_LOCAL_SLOT"], gpu["RANK"], gpu["RLKIT_DEVICE"]) == (
            "0", str(slot), str(4 + slot), "cuda")
        assert gpu["NCCL_CUMEM_ENABLE"] == os.environ.get("NCCL_CUMEM_ENABLE", "0")
        cpu = rank_env(4 + slot, 8, slot, 4, use_gpu=False)
        assert (cpu["LOCAL_RANK"], cpu["RLKIT_DEVICE"]) == (str(slot), "cpu") and "NCCL_CUMEM_ENABLE" not in cpu
        for key, value in gpu.items():
            monkeypatch.setenv(key, value)
        assert Worker().local_rank == 0


def test_cpu_group_never_takes_a_gpu(monkeypatch):
    """Item 7: a group placed without GPUs computes on the CPU even where the process sees one (Ray 2.60 does not
    hide the node's GPUs from it)."""
    from rlkit.controller.worker import DEVICE_ENV, pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU node, as far as pick_device can tell
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert pick_device() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    assert pick_device() == torch.device("cuda", 0)


def test_tensor_parallel_engines_turn_custom_all_reduce_off():
    """Defect 3: each TP rank sees one GPU, where vLLM's custom all-reduce fails its start-up check; the keys are
    ones vllm.LLM takes (checked against the installed vLLM)."""
    from rlkit.rollout.vllm_rollout import check_vllm_kwargs
    from rlkit.workers.rollout_worker import TENSOR_PARALLEL_ENGINE_KWARGS

    assert TENSOR_PARALLEL_ENGINE_KWARGS["disable_custom_all_reduce"] is True
    assert TENSOR_PARALLEL_ENGINE_KWARGS["distributed_executor_backend"] == "external_launcher"
    check_vllm_kwargs(TENSOR_PARALLEL_ENGINE_KWARGS)
