"""The generative judge's settings (`reward_model.judge`): an LLM scores each response from a prompt template.

Owned by rlkit/reward/llm_judge.py; kept here so the config layer stays the bottom layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def f(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class JudgeConfig:
    backend: str = f("http", "where the judge runs (rlkit.reward.llm_judge.JUDGE_BACKENDS): http = an OpenAI-"
                     "compatible endpoint; vllm = an in-process vLLM engine with its own small model")
    model: str = f("", "model name sent to the endpoint (http) or model path/alias loaded (vllm)")
    base_url: str = f("", "http: the endpoint, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = f("OPENAI_API_KEY", "http: environment variable holding the API key (may be unset)")
    template: str = f("", "prompt template with {prompt}, {response}, {ground_truth}; empty = the built-in one "
                      "asking for a 0-10 score")
    template_path: str | None = f(None, "file holding the template (instead of `template`)")
    parser: str = f("last_number_0_10", "how a verdict becomes a score (rlkit.reward.llm_judge.JUDGE_PARSERS), "
                    "or 'path/to/file.py:function'")
    concurrency: int = f(8, "http: requests in flight")
    timeout_s: float = f(30.0, "http: per-request timeout; a timeout scores 0 and counts an error")
    retries: int = f(2, "http: retries after a failed request (5xx, connection error, timeout)")
    max_tokens: int = f(64, "tokens the judge may generate per verdict")
    temperature: float = f(0.0, "judge sampling temperature")
    kv_cache_memory_bytes: int = f(256 * 1024**2, "vllm: the judge engine's KV cache size")
