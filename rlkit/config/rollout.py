"""`RolloutConfig`: the `actor_rollout_ref.rollout` config section.

Key names follow the convention of existing RL toolkits so run scripts carry
over (`rollout.n`, `rollout.response_length`, `rollout.gpu_memory_utilization`,
`rollout.val_kwargs.*`). Defaults are chosen to work on a laptop CPU:

* `dtype="auto"`: bfloat16 on GPU; on CPU the dtype the actor's `param_dtype: auto`
  measured for this machine (rlkit/utils/cpu_precision.py: bf16 only where its matmuls
  are faster, float32 otherwise), so engine and actor compute alike and, in float32,
  rollout and actor log-probs agree to ~1e-5.
* `kv_cache_memory_mb=null`: on CPU the KV cache is sized from the batch (`batch_rows`
  sequences of `prompt_length + response_length` tokens, rlkit/rollout/kv_cache_size.py): a
  fixed budget is more predictable than a fraction of shared host memory, and one sized to what
  a batch can use leaves the rest to the actor; set it to choose. `gpu_memory_utilization` is
  used on GPU only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rlkit.config.agent import MultiTurnConfig
from rlkit.config.profiler import RoleProfilerConfig
from rlkit.errors import UserError

DTYPES = ("auto", "bfloat16", "float32", "float16")
ENGINE_KWARGS_BACKENDS = ("vllm", "sglang", "trtllm")  # verl's engine_kwargs sections; rlkit runs vllm
# vllm.LLM kwargs rlkit sets itself (besides those named as a rollout key): the key to set instead, or why
RESERVED_VLLM_KWARGS = {
    "model": "actor_rollout_ref.model.path",
    "tensor_parallel_size": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "kv_cache_memory_bytes": "actor_rollout_ref.rollout.kv_cache_memory_mb",
    "enable_lora": "actor_rollout_ref.rollout.lora_sync=native",
    "enable_sleep_mode": "the engine sleeps between rollouts (actor_rollout_ref.rollout.free_cache_engine)",
    "skip_tokenizer_init": "rlkit generates token ids in, token ids out",
    "logprobs_mode": "rollout log-probs must be the sampling distribution's (processed_logprobs)",
    "mm_processor_kwargs": "data.mm_processor_kwargs: the engine's image processor has the trainer's settings",
}
LORA_SYNC_MODES = ("merge", "native")


def _no_engine_kwargs() -> dict:
    return {name: {} for name in ENGINE_KWARGS_BACKENDS}


@dataclass
class SamplingConfig:
    """What one `generate` call samples (built by `RolloutConfig.to_sampling`); `greedy=True` ignores
    temperature/top-p/top-k."""

    response_length: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    greedy: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    calculate_log_probs: bool = False
    seed: int | None = None
    ignore_eos: bool = False  # generate response_length tokens whatever is sampled: the model's EOS does not stop
    return_routed_experts: bool = False  # MoE: also return `routed_experts` (actor.router_replay; hf backend)

    def stops(self, model_stop_ids: list[int]) -> list[int]:
        """The token ids that end a sequence: these settings' own, then the model's EOS ids unless `ignore_eos`."""
        return list(dict.fromkeys([*self.stop_token_ids, *([] if self.ignore_eos else model_stop_ids)]))


@dataclass
class ValKwargs:
    """Sampling used for validation (`rollout.val_kwargs`); greedy by default."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling; 1.0 = off
    top_k: int = -1  # -1 = off
    n: int = 1  # samples per validation prompt (mean@n, best@n, maj@n)
    do_sample: bool = False  # false = greedy whatever the temperature


@dataclass
class RolloutConfig:
    """Rollout engine + sampling settings. See the module docstring for the CPU defaults."""

    name: str | None = None  # rollout backend (ROLLOUT_BACKENDS); None -> default_backend_name()
    mode: str = "sync"  # multi_turn server: sync = tick batching, async = continuous batching on vllm (docs/agents.md)
    n: int = 1  # samples per prompt; the driver repeats rows, backends see one row per sample
    prompt_length: int = 512  # longest prompt in tokens (set from data.max_prompt_length)
    response_length: int = 512  # max new tokens (set from data.max_response_length)
    temperature: float = 1.0  # sampling temperature for training rollouts
    top_p: float = 1.0  # nucleus sampling; 1.0 = off
    top_k: int = -1  # -1 = off
    do_sample: bool = True  # false = greedy training rollouts
    dtype: str = "auto"  # engine dtype: auto (GPU bf16; CPU what the actor measured) | float32 | bfloat16 | float16
    enforce_eager: bool = True  # vLLM: no CUDA graphs / torch.compile (faster start, slower decode on GPU)
    tensor_model_parallel_size: int = 1  # vLLM: ranks per engine; consecutive workers form TP groups
    gpu_memory_utilization: float = 0.5  # vLLM on GPU: fraction of device memory for weights + KV cache
    kv_cache_memory_mb: int | None = None  # vLLM on CPU: KV-cache size; null -> sized from batch_rows x model_len
    batch_rows: int = 64  # most sequences an engine holds at once (set from data.train_batch_size x n, max_num_seqs)
    mm_processor_kwargs: dict = field(default_factory=dict)  # VLM image settings (set from data.mm_processor_kwargs)
    max_num_seqs: int = 64  # vLLM scheduler batch; HF micro-batch size
    max_num_batched_tokens: int | None = None  # None -> vLLM's default
    enable_chunked_prefill: bool = True  # vLLM: split long prefills into chunks batched with decodes
    enable_prefix_caching: bool = True  # vLLM: reuse the KV cache of shared prompt prefixes (multi-turn contexts)
    disable_log_stats: bool = True  # vLLM: no periodic throughput/cache log lines
    load_format: str = "dummy"  # vLLM weight loading at start; dummy = auto in rlkit (the folder's weights, see docs)
    engine_kwargs: dict = field(default_factory=_no_engine_kwargs)  # vllm: more vllm.LLM kwargs; sglang, trtllm: empty
    max_model_len: int | None = None  # None -> prompt_length + response_length
    free_cache_engine: bool = True  # sleep the engine between rollouts
    # separate engines (trainer.one_step_off_policy / fully_async): where they run and how weights reach them
    nnodes: int = 0  # nodes of the engines' own pool; 0 = the trainer's nodes (trainer.nnodes), shared with it
    n_gpus_per_node: int = 0  # engine processes per node; 0 = trainer.rollout_workers_per_node
    weight_transfer: str = "broadcast"  # broadcast (a collective from the actor's rank 0) | object_store (Ray's)
    update_weights_bucket_megabytes: float = 512  # the broadcast's bucket: at most this much in flight per process
    # 1: drop KV cache, keep weights; 2: drop both; null: 2 for a colocated vLLM-cpu engine (its weights are loaded
    # again from the actor before every generation anyway, and on CPU they would hold host memory), else 1
    sleep_level: int | None = None
    calculate_log_probs: bool = False  # also return rollout_log_probs
    ignore_eos: bool = False  # every sequence runs to response_length: EOS is an ordinary token (fixed-length benches)
    # the actor's old-log-prob pass (help as metadata: too long for a trailing comment)
    log_prob_micro_batch_size: int | None = field(default=None, metadata={"help": (
        "deprecated global log_prob_micro_batch_size_per_gpu: rows over all workers, divided by their count; "
        "null = unset")})
    log_prob_micro_batch_size_per_gpu: int | None = field(default=None, metadata={"help": (
        "rows per forward of the actor's old-log-prob pass; null = log_prob_micro_batch_size / workers when set, "
        "else actor.ppo_micro_batch_size_per_gpu")})
    log_prob_use_dynamic_bsz: bool | None = field(default=None, metadata={"help": (
        "old-log-prob forwards by a token budget; null = actor.use_dynamic_bsz")})
    log_prob_max_token_len_per_gpu: int | None = field(default=None, metadata={"help": (
        "token budget of an old-log-prob forward; null = actor.ppo_max_token_len_per_gpu")})
    seed: int = 0  # engine seed (vLLM) / seed of the HF backend's private sampling stream
    lora_sync: str = "merge"  # LoRA: merge (adapter merged into the synced weights) | native (vLLM LoRARequest)
    max_lora_rank: int = 0  # set from actor_rollout_ref.model.lora_rank (native sync: the engine's LoRA slots)
    chat_template_kwargs: dict = field(default_factory=dict)  # set from data.apply_chat_template_kwargs (agent loop)
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)  # agent loop with tools (docs/agents.md)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)  # trace at global_profiler.steps

    def __post_init__(self) -> None:
        if isinstance(self.val_kwargs, dict):
            self.val_kwargs = ValKwargs(**self.val_kwargs)
        if isinstance(self.multi_turn, dict):
            self.multi_turn = MultiTurnConfig(**self.multi_turn)
        self.validate()

    def validate(self) -> None:
        """Raise UserError naming the key for values no backend can use."""
        p = "actor_rollout_ref.rollout."
        if self.dtype not in DTYPES:
            raise UserError(f"{p}dtype='{self.dtype}' is not supported; use one of {list(DTYPES)}")
        for key in ("n", "prompt_length", "response_length", "max_num_seqs", "tensor_model_parallel_size",
                    "kv_cache_memory_mb", "batch_rows"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise UserError(f"{p}{key}={getattr(self, key)} must be >= 1")
        for prefix, temp, top_p, top_k in (
            (p, self.temperature, self.top_p, self.top_k),
            (p + "val_kwargs.", self.val_kwargs.temperature, self.val_kwargs.top_p, self.val_kwargs.top_k),
        ):
            if temp < 0:
                raise UserError(f"{prefix}temperature={temp} must be >= 0")
            if not 0 < top_p <= 1:
                raise UserError(f"{prefix}top_p={top_p} must be in (0, 1]")
            if top_k == 0 or top_k < -1:
                raise UserError(f"{prefix}top_k={top_k} must be -1 (off) or >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UserError(f"{p}gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        self._check_engine_kwargs(p)
        if self.lora_sync not in LORA_SYNC_MODES:
            raise UserError(f"{p}lora_sync='{self.lora_sync}' is not supported; use one of {list(LORA_SYNC_MODES)}")
        if self.sleep_level not in (None, 1, 2):
            raise UserError(f"{p}sleep_level={self.sleep_level} must be 1, 2 or null (rlkit chooses)")
        if self.max_model_len is not None and self.max_model_len < self.prompt_length + self.response_length:
            raise UserError(
                f"{p}max_model_len={self.max_model_len} is shorter than prompt_length + response_length "
                f"({self.prompt_length + self.response_length}); raise it or leave it unset"
            )
        if self.ignore_eos and self.multi_turn.enable:
            raise UserError(f"{p}ignore_eos=true: a multi-turn rollout's turns end at EOS; set it only for single-turn "
                            f"rollouts ({p}multi_turn.enable=false)")

    def _check_engine_kwargs(self, p: str) -> None:
        if not isinstance(self.engine_kwargs, dict):
            raise UserError(f"{p}engine_kwargs must be a mapping {{vllm: {{...}}}}, got {self.engine_kwargs!r}")
        for backend, kwargs in self.engine_kwargs.items():
            if backend not in ENGINE_KWARGS_BACKENDS:
                raise UserError(f"{p}engine_kwargs.{backend}: not an engine; use one of {list(ENGINE_KWARGS_BACKENDS)}")
            if kwargs is not None and not isinstance(kwargs, dict):
                raise UserError(f"{p}engine_kwargs.{backend} must be a mapping of keyword arguments, got {kwargs!r}")
            if backend != "vllm" and kwargs:
                raise UserError(f"{p}engine_kwargs.{backend}={kwargs}: rlkit runs vllm (or hf), not {backend}; "
                                f"put engine arguments under {p}engine_kwargs.vllm")
        own_keys = {f.name for f in fields(self)}
        for key in self.vllm_kwargs:
            if key in own_keys:
                raise UserError(f"{p}engine_kwargs.vllm.{key}: set {p}{key} instead (one place per setting)")
            if key in RESERVED_VLLM_KWARGS:
                raise UserError(f"{p}engine_kwargs.vllm.{key}: rlkit sets it ({RESERVED_VLLM_KWARGS[key]})")

    @property
    def vllm_kwargs(self) -> dict:
        """`engine_kwargs.vllm`: extra `vllm.LLM` keyword arguments."""
        return dict(self.engine_kwargs.get("vllm") or {})

    @property
    def model_len(self) -> int:
        """The context the engine must hold: prompt + response unless set explicitly."""
        return self.max_model_len or self.prompt_length + self.response_length

    def to_sampling(self, greedy: bool = False) -> SamplingConfig:
        """Training-time sampling; `greedy=True` (or `do_sample=False`) forces argmax decoding."""
        return SamplingConfig(
            response_length=self.response_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            greedy=greedy or not self.do_sample or self.temperature == 0,
            calculate_log_probs=self.calculate_log_probs,
            ignore_eos=self.ignore_eos,
        )

    def to_val_sampling(self) -> SamplingConfig:
        """Validation sampling from `val_kwargs` (greedy unless `val_kwargs.do_sample`)."""
        v = self.val_kwargs
        return SamplingConfig(
            response_length=self.response_length,
            temperature=v.temperature,
            top_p=v.top_p,
            top_k=v.top_k,
            greedy=not v.do_sample or v.temperature == 0,
            calculate_log_probs=False,
            ignore_eos=self.ignore_eos,
        )
