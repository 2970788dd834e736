"""The rollout backend interface and its registry.

Rollout is token-in/token-out. The driver repeats each prompt `n` times before
calling `generate`, so a backend produces exactly one response per input row.

Input Batch tensors (prompts left-padded to a common length P):
    input_ids (B, P) long, attention_mask (B, P) long, position_ids (B, P) long
Output Batch tensors (responses right-padded to R = config.response_length):
    prompts (B, P)            the input ids, unchanged
    responses (B, R)          generated ids, pad_token_id after the end
    response_mask (B, R)      1 for generated tokens (EOS included), 0 for padding
    input_ids (B, P+R)        prompts ++ responses
    attention_mask (B, P+R)   prompt mask ++ response_mask
    position_ids (B, P+R)     continuing the prompt positions
    rollout_log_probs (B, R)  float32, only when `calculate_log_probs` is set
Non-tensor data and meta of the input are carried through unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from rlkit.config.rollout import SamplingConfig
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.registry import Registry

if TYPE_CHECKING:
    from rlkit.rollout.slice_plan import Cut, SlicePlan

WAKE_ORDER = ("weights", "kv_cache")  # the parts an engine sleeps, in the order they wake
SLEEP_PARTS = frozenset(WAKE_ORDER)


class RolloutBackend(ABC):
    """One engine per worker process. Created once, then generate/sync/sleep/wake many times."""

    #: the parts held asleep: the one record of the engine's sleep state (EngineLifecycle wakes what it names)
    asleep: frozenset[str] = frozenset()

    #: whether consecutive workers may form one engine (rollout.tensor_model_parallel_size > 1)
    tensor_parallel: bool = False
    #: whether `generate` can return the experts an MoE model routed each token to (actor.router_replay)
    returns_routed_experts: bool = False

    @abstractmethod
    def generate(self, prompts: Batch, sampling: SamplingConfig) -> Batch:
        """Generate one response per row; see the module docstring for the layout."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load full (unsharded) HF-named tensors into the engine; returns bytes loaded."""

    def slice_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> SlicePlan | None:
        """A tensor-parallel engine's cuts of the trainer's tensors (`shapes`: HF name -> whole shape), so each rank
        receives only its slices (`update_slices`); None: this engine loads full tensors (`update_weights`)."""
        return None

    def update_slices(self, buckets: Iterable[list[tuple[Cut, torch.Tensor]]]) -> int:
        """Write buckets of this rank's slices, cut by `slice_plan`; returns bytes loaded."""
        raise NotImplementedError(f"{type(self).__name__} has no slice_plan: it loads full tensors")

    def load_adapter(self, peft_config: dict, tensors: dict[str, torch.Tensor]) -> int:
        """LoRA with `rollout.lora_sync=native`: generate with this PEFT adapter (config dict, tensors under
        PEFT's file names) on the engine's base weights from now on; returns bytes loaded."""
        raise UserError(f"actor_rollout_ref.rollout.lora_sync=native needs an engine that loads LoRA adapters "
                        f"(vllm); {type(self).__name__} does not: use lora_sync=merge")

    @property
    def sleeping(self) -> bool:
        """Whether any part (weights, KV cache) is asleep."""
        return bool(self.asleep)

    def sleep(self, level: int | None = None) -> None:
        """Free what the engine can between rollouts (KV cache; level 2 also weights): every part is asleep after.
        `level` None: the engine's configured level."""
        if self.asleep == SLEEP_PARTS:
            return
        self._release(level)
        self.asleep = SLEEP_PARTS

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo `sleep` before the next generate; `tags` ("weights", "kv_cache") wakes one part, None all.
        The order (weights, load, KV cache) is `EngineLifecycle`'s (rlkit/rollout/lifecycle.py)."""
        wake = [t for t in (tags or WAKE_ORDER) if t in self.asleep]
        if wake:
            self._restore(wake)
            self.asleep = self.asleep - set(wake)

    def _release(self, level: int | None) -> None:  # noqa: B027 - optional hook, a no-op by default
        """What `sleep` frees (the engine's own calls); the bookkeeping is `sleep`'s."""

    def _restore(self, parts: list[str]) -> None:  # noqa: B027 - optional hook, a no-op by default
        """What `wake_up` brings back for `parts`, in that order."""

    def discards_weights(self, level: int) -> bool:
        """Whether `sleep(level)` forgets the weights, so they must be loaded again before generating."""
        return False

    def memory_parts(self) -> dict[str, float]:
        """GB this engine holds now, by part (`weights_gb`, `kv_cache_gb`), for `memory/rollout/*`; {} if unknown."""
        return {}


ROLLOUT_BACKENDS: Registry[type[RolloutBackend]] = Registry("rollout backend", fill=("rlkit.rollout",))


def assemble_output(
    prompts: Batch,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor | None = None,
    response_attention: torch.Tensor | None = None,
) -> Batch:
    """Build the output Batch from right-padded responses (shared by every backend and the agent loop).

    `response_mask` marks the tokens that are trained on; `response_attention` the tokens that
    exist (default: the same). They differ in multi-turn rollouts, where tool output is part of
    the sequence but not trained on."""
    prompt_ids = prompts.tensors["input_ids"]
    prompt_mask = prompts.tensors["attention_mask"]
    prompt_pos = prompts.tensors["position_ids"]
    response_mask = response_mask.to(prompt_mask.dtype)
    attention = response_mask if response_attention is None else response_attention.to(prompt_mask.dtype)
    steps = torch.arange(1, responses.shape[1] + 1, dtype=prompt_pos.dtype).unsqueeze(0)
    response_pos = prompt_pos[:, -1:] + steps
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, attention], dim=1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
    }
    if rollout_log_probs is not None:
        tensors["rollout_log_probs"] = rollout_log_probs.float()
    out = Batch(tensors, prompts.non_tensors, prompts.meta)
    return out


def engine_torch_dtype(name: str) -> torch.dtype:
    """A resolved `engine_dtype` name as a torch dtype."""
    return getattr(torch, name)


def engine_dtype(name: str, on_gpu: bool) -> str:
    """`rollout.dtype` resolved: `auto` is bfloat16 on GPU and, on CPU, the actor's measured choice
    (`param_dtype: auto`, cached per machine), so the engine samples with the numerics the actor scores."""
    if name != "auto":
        return name
    if on_gpu:
        return "bfloat16"
    from rlkit.utils.cpu_precision import auto_cpu_dtype

    return str(auto_cpu_dtype()).removeprefix("torch.")
