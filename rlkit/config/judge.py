"""The generative judge's settings (`reward_model.judge`): an LLM scores each response from a prompt template.

Owned by rlkit/reward/llm_judge.py; kept here so the config layer stays the bottom layer. `validate` checks
the values no backend can use; what needs the registries (backend and parser names, the template's
placeholders, a backend's required keys) is checked by `rlkit.reward.llm_judge.check_judge_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.errors import UserError

PREFIX = "reward_model.judge."


def f(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class JudgeConfig:
    backend: str = f(
        "http",
        "where the judge runs (rlkit.reward.judge_backends.JUDGE_BACKENDS): http = an OpenAI-"
        "compatible endpoint; vllm = an in-process vLLM engine with its own small model",
    )
    model: str = f("", "model name sent to the endpoint (http) or local model folder loaded (vllm)")
    base_url: str = f("", "http: the endpoint, e.g. http://127.0.0.1:8000/v1 (/chat/completions is appended)")
    api_key_env: str = f("OPENAI_API_KEY", "http: environment variable holding the API key (may be unset)")
    template: str = f(
        "",
        "prompt template with {prompt}, {response}, {ground_truth} ({{ and }} for literal "
        "braces); empty = the built-in one asking for a 0-10 score",
    )
    template_path: str | None = f(None, "file holding the template (instead of `template`)")
    parser: str = f(
        "last_number_0_10",
        "how a verdict becomes a score (rlkit.reward.judge_text.JUDGE_PARSERS), "
        "or 'path/to/file.py:function' (a function text -> float, None when it finds no score)",
    )
    concurrency: int = f(8, "http: requests in flight; vllm: the engine's batch (max_num_seqs)")
    timeout_s: float = f(30.0, "http: per-request timeout (whole request); a timeout scores 0 and counts an error")
    retries: int = f(2, "http: retries after a failed request (5xx, 408, 429, connection error, timeout)")
    retry_backoff_s: float = f(0.5, "http: wait before the first retry, doubled for each next one")
    max_tokens: int = f(64, "tokens the judge may generate per verdict")
    temperature: float = f(0.0, "judge sampling temperature")
    seed: int = f(0, "vllm: engine seed")
    dtype: str = f("auto", "vllm: engine dtype (auto | float32 | bfloat16 | float16)")
    max_model_len: int | None = f(
        None, "vllm: the engine's context length; None = the model's. A longer judge prompt scores 0 with an error"
    )
    kv_cache_memory_bytes: int = f(256 * 1024**2, "vllm: the judge engine's KV cache size")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise UserError naming the key for values no backend can use."""
        for key in ("concurrency", "max_tokens", "kv_cache_memory_bytes"):
            if getattr(self, key) < 1:
                raise UserError(f"{PREFIX}{key}={getattr(self, key)} must be >= 1")
        if self.retries < 0:
            raise UserError(f"{PREFIX}retries={self.retries} must be >= 0")
        if not self.timeout_s > 0:
            raise UserError(f"{PREFIX}timeout_s={self.timeout_s} must be > 0")
        if self.retry_backoff_s < 0:
            raise UserError(f"{PREFIX}retry_backoff_s={self.retry_backoff_s} must be >= 0")
        if self.temperature < 0:
            raise UserError(f"{PREFIX}temperature={self.temperature} must be >= 0")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise UserError(f"{PREFIX}dtype='{self.dtype}' is not supported; use auto, float32, bfloat16 or float16")
        if self.max_model_len is not None and self.max_model_len <= self.max_tokens:
            raise UserError(
                f"{PREFIX}max_model_len={self.max_model_len} leaves no room for the prompt; "
                f"make it larger than max_tokens={self.max_tokens}"
            )
        if self.template and self.template_path:
            raise UserError(f"{PREFIX}template and {PREFIX}template_path are both set; keep one")
