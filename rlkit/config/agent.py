"""`MultiTurnConfig`: the `actor_rollout_ref.rollout.multi_turn` config section (agent rollouts).

Kept free of heavy imports: the rollout config imports it at start-up. Tool, parser and
interaction names are checked against their registries by the agent package
(`rlkit.rollout.agent.check.check_multi_turn`), which the config layer does not import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlkit.errors import UserError

PREFIX = "actor_rollout_ref.rollout.multi_turn."


@dataclass
class MultiTurnConfig:
    """Agent loop settings; `enable=false` keeps plain one-shot generation."""

    enable: bool = False  # run the agent loop (generate -> tools -> generate ...) instead of one-shot generation
    max_turns: int = 4  # assistant turns per sample; tool calls of the last turn are not run
    tools: list[str] = field(default_factory=lambda: ["calculator"])  # tool names (rlkit.rollout.agent.TOOLS) offered
    max_parallel_tools: int = 8  # tool calls running at once, all samples together
    format: str = "hermes"  # tool-call parser: hermes = <tool_call>{"name":..,"arguments":{..}}</tool_call>
    stop_at_tool_end: bool = False  # also stop a turn at the </tool_call> token (one call per turn)
    tool_timeout_s: float = 10.0  # a tool call running longer returns a timeout error to the model
    max_tool_response_chars: int = 1024  # tool output is cut to this many characters
    tool_config: dict = field(default_factory=dict)  # tool name -> constructor kwargs, e.g. {python: {wall_s: 3}}
    interaction: str | None = None  # simulated user (rlkit.rollout.agent.INTERACTIONS) answering tool-free turns
    interaction_config: dict = field(default_factory=dict)  # constructor kwargs of the interaction
    interaction_reward_weight: float = 0.0  # x the episode's interaction reward, added to the score (0: only logged)
    external_agent: str | None = None  # an agent (EXTERNAL_AGENTS) run per sample against the OpenAI endpoint
    external_agent_config: dict = field(default_factory=dict)  # keyword arguments of the external agent
    batch_wait_ms: float = 20.0  # batching server: wait for conversations still in tools (>= 1/4 of the last call)

    def __post_init__(self) -> None:
        for key in ("max_turns", "max_parallel_tools", "max_tool_response_chars"):
            if getattr(self, key) < 1:
                raise UserError(f"{PREFIX}{key}={getattr(self, key)} must be >= 1")
        if self.tool_timeout_s <= 0:
            raise UserError(f"{PREFIX}tool_timeout_s={self.tool_timeout_s} must be > 0")
        if self.batch_wait_ms < 0:
            raise UserError(f"{PREFIX}batch_wait_ms={self.batch_wait_ms} must be >= 0")
