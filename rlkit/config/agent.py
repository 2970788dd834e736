"""`MultiTurnConfig`: the `actor_rollout_ref.rollout.multi_turn` config section (agent rollouts).

Kept free of heavy imports: the rollout config imports it at start-up. Tool, parser and
interaction names (and the YAML files of `tool_config_path` / `interaction_config_path`) are
checked against their registries by the agent package (`rlkit.rollout.agent.check.check_multi_turn`),
which the config layer does not import.

Keys named as verl names them keep verl's meaning and default; two rlkit names predate them and set
the same value: `max_turns` (= `max_assistant_turns`) and `max_tool_response_chars`
(= `max_tool_response_length`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rlkit.errors import UserError

PREFIX = "actor_rollout_ref.rollout.multi_turn."
TRUNCATE_SIDES = ("left", "middle", "right")
DEFAULT_TOOLS = ("calculator",)
# rlkit's earlier name -> (the verl key it sets, that key's default)
_SAME_AS = {"max_turns": ("max_assistant_turns", None), "max_tool_response_chars": ("max_tool_response_length", 256)}


@dataclass
class MultiTurnConfig:
    """Agent loop settings; `enable=false` keeps plain one-shot generation."""

    enable: bool = False  # run the agent loop (generate -> tools -> generate ...) instead of one-shot generation
    max_assistant_turns: int | None = None  # model turns per sample (the last one's tool calls not run); null: no cap
    max_turns: int | None = None  # rlkit's name for max_assistant_turns (set one of them)
    max_user_turns: int | None = None  # tool-result and simulated-user turns per sample; null: no limit
    tools: list[str] = field(default_factory=lambda: list(DEFAULT_TOOLS))  # tools offered (rlkit.rollout.agent.TOOLS)
    tool_config: dict = field(default_factory=dict)  # tool name -> constructor kwargs, e.g. {python: {wall_s: 3}}
    tool_config_path: str | None = None  # verl's tool-config YAML (docs/agents.md); replaces tools and tool_config
    max_parallel_calls: int = 1  # tool calls run per model turn (the first N; later calls of the turn are skipped)
    max_parallel_tools: int = 8  # tool calls running at once, all samples together
    format: str = "hermes"  # tool-call parser: hermes = <tool_call>{"name":..,"arguments":{..}}</tool_call>
    stop_at_tool_end: bool = False  # also stop a turn at the </tool_call> token (one call per turn)
    tool_timeout_s: float = 10.0  # a tool call running longer returns a timeout error to the model
    max_tool_response_length: int = 256  # tool output longer than this many characters is truncated
    max_tool_response_chars: int | None = None  # rlkit's name for max_tool_response_length (set one of them)
    tool_response_truncate_side: str = "middle"  # long tool output keeps: left = head, right = tail, middle = both
    interaction: str | None = None  # simulated user (rlkit.rollout.agent.INTERACTIONS) answering tool-free turns
    interaction_config: dict = field(default_factory=dict)  # constructor kwargs of the interaction
    interaction_config_path: str | None = None  # verl's interaction YAML (one entry); replaces interaction(_config)
    interaction_reward_weight: float = 0.0  # x the episode's interaction reward, added to the score (0: only logged)
    external_agent: str | None = None  # an agent (EXTERNAL_AGENTS) run per sample against the OpenAI endpoint
    external_agent_config: dict = field(default_factory=dict)  # keyword arguments of the external agent
    batch_wait_ms: float = 20.0  # batching server: wait for conversations still in tools (>= 1/4 of the last call)

    def __post_init__(self) -> None:
        for key in ("max_assistant_turns", "max_turns", "max_user_turns", "max_tool_response_chars"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise UserError(f"{PREFIX}{key}={value} must be >= 1 (or null: no limit)")
        for key in ("max_parallel_calls", "max_parallel_tools", "max_tool_response_length"):
            if getattr(self, key) < 1:
                raise UserError(f"{PREFIX}{key}={getattr(self, key)} must be >= 1")
        for old, (new, default) in _SAME_AS.items():
            self._merge_alias(old, new, default)
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise UserError(f"{PREFIX}tool_response_truncate_side='{self.tool_response_truncate_side}' is not "
                            f"supported; use one of {list(TRUNCATE_SIDES)}")
        if self.tool_timeout_s <= 0:
            raise UserError(f"{PREFIX}tool_timeout_s={self.tool_timeout_s} must be > 0")
        if self.batch_wait_ms < 0:
            raise UserError(f"{PREFIX}batch_wait_ms={self.batch_wait_ms} must be >= 0")
        if self.tool_config_path is not None:
            if list(self.tools) not in (list(DEFAULT_TOOLS), []) or self.tool_config:
                raise UserError(f"{PREFIX}tool_config_path lists the tools: leave {PREFIX}tools and "
                                f"{PREFIX}tool_config unset, or drop tool_config_path")
            self.tools = []  # the file's tools are offered, not the default
            self.tool_config_path = _absolute(self.tool_config_path, "tool_config_path")
        if self.interaction_config_path is not None:
            if self.interaction is not None or self.interaction_config:
                raise UserError(f"{PREFIX}interaction_config_path names the simulated user: leave {PREFIX}interaction "
                                f"and {PREFIX}interaction_config unset, or drop interaction_config_path")
            self.interaction_config_path = _absolute(self.interaction_config_path, "interaction_config_path")

    def _merge_alias(self, old: str, new: str, default: int | None) -> None:
        """Both names hold one value: the one set wins (an rlkit name over the verl key's default); two different
        values are an error."""
        old_value, new_value = getattr(self, old), getattr(self, new)
        if old_value is None:
            setattr(self, old, new_value)
            return
        if new_value not in (old_value, default):
            raise UserError(f"{PREFIX}{old}={old_value} and {PREFIX}{new}={new_value} are the same setting; "
                            f"set one of them")
        setattr(self, new, old_value)


def _absolute(path: str, key: str) -> str:
    """The file resolved against the directory the run starts in (workers may start elsewhere)."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise UserError(f"{PREFIX}{key}={path}: no such file")
    return str(resolved)
