"""`AgentRollout`: a rollout backend that runs the multi-turn agent loop over another backend.

The rollout worker wraps its engine in this when `rollout.multi_turn.enable` is
set; weight sync, sleep and wake go straight to the wrapped engine, and
`generate` runs one coroutine per row (rlkit/rollout/agent/loop.py) against the
server `rollout.mode` names in `ENGINE_SERVERS`: `sync`, a `BatchingServer` that
batches the conversations' turns into the engine's own token-in/token-out
`generate` (every registered backend); `async`, a `ContinuousServer` that submits
each turn to the in-process vLLM engine as soon as it is ready (continuous
batching; other backends fall back to tick batching, logged once). The server of
one `generate` is shut down before it returns, so the engine is idle for weight
sync and sleep.

The driver sends the rows' `raw_prompt` (re-rendered with the tool schemas),
`tools_kwargs`, `interaction_kwargs`, `reward_model` and `extra_info` (where verl's
datasets keep the two kwargs) along with the prompt tensors (`AGENT_INPUT_KEYS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rlkit.config.rollout import RolloutConfig
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.rollout.agent.chat import ChatRenderer
from rlkit.rollout.agent.check import check_multi_turn
from rlkit.rollout.agent.continuous import ContinuousServer  # noqa: F401  (registers mode "async")
from rlkit.rollout.agent.engine import ENGINE_SERVERS
from rlkit.rollout.agent.loop import AgentLoop
from rlkit.rollout.agent.parser import TOOL_PARSERS
from rlkit.rollout.agent.verl_files import build_configured_interaction, build_configured_tools
from rlkit.rollout.base import RolloutBackend, SamplingConfig
from rlkit.rollout.slice_plan import Cut, SlicePlan

AGENT_INPUT_KEYS = ("raw_prompt", "tools_kwargs", "interaction_kwargs", "reward_model", "extra_info")


def agent_input_keys(batch: Batch) -> list[str]:
    """The non-tensor columns of `batch` the agent loop reads (those present)."""
    return [k for k in AGENT_INPUT_KEYS if k in batch.non_tensors]


class AgentRollout(RolloutBackend):
    def __init__(self, backend: RolloutBackend, tokenizer: Any, config: RolloutConfig) -> None:
        mt = config.multi_turn
        check_multi_turn(mt)
        if config.mode not in ENGINE_SERVERS:
            raise UserError(
                f"actor_rollout_ref.rollout.mode='{config.mode}' is not registered; "
                f"choose from {ENGINE_SERVERS.names()}"
            )
        self.make_server = ENGINE_SERVERS.get(config.mode)
        self.backend, self.tokenizer, self.config, self.mt = backend, tokenizer, config, mt
        self.tools = build_configured_tools(mt)
        self.parser = TOOL_PARSERS.get(mt.format)()
        schemas = [t.schema() for t in self.tools.values()]
        self.renderer = ChatRenderer(tokenizer, schemas, self.parser.instructions(schemas) if schemas else None,
                                     config.chat_template_kwargs)
        end_id = self.parser.end_token_id(tokenizer)
        self.extra_stop_ids = [end_id] if mt.stop_at_tool_end and end_id is not None else []
        self.interaction = build_configured_interaction(mt)
        self.last_stats: dict[str, float] = {}
        self._last_call_s = 0.0

    def generate(self, prompts: Batch, sampling: SamplingConfig) -> Batch:
        server = self.make_server(self.backend, sampling, self.extra_stop_ids, self.config, self._last_call_s)
        loop = AgentLoop(server, self.tokenizer, self.mt, self.tools, self.parser, self.renderer, self.interaction)
        try:
            out = loop.generate(prompts, sampling.response_length, sampling.calculate_log_probs)
        finally:
            server.shutdown()
        self.last_stats = server.stats.metrics()
        self._last_call_s = server.last_call_s
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        return self.backend.update_weights(named_tensors)

    def load_adapter(self, peft_config: dict, tensors: dict[str, torch.Tensor]) -> int:
        return self.backend.load_adapter(peft_config, tensors)

    def slice_plan(self, shapes: Mapping[str, tuple[int, ...]]) -> SlicePlan | None:
        return self.backend.slice_plan(shapes)

    def update_slices(self, buckets: Iterable[list[tuple[Cut, torch.Tensor]]]) -> int:
        return self.backend.update_slices(buckets)

    @property
    def asleep(self) -> frozenset[str]:  # type: ignore[override] - the wrapped engine's record, not a second one
        return self.backend.asleep

    def sleep(self, level: int | None = None) -> None:
        self.backend.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.backend.wake_up(tags)

    def discards_weights(self, level: int) -> bool:
        return self.backend.discards_weights(level)

    def memory_parts(self) -> dict[str, float]:
        return self.backend.memory_parts()

    def __getattr__(self, name: str) -> Any:  # memory_report, close, last_update, ... of the wrapped engine
        if name == "backend":
            raise AttributeError(name)
        return getattr(self.backend, name)
