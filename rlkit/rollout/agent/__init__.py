"""Multi-turn agent rollouts: the async agent loop, tools, tool-call parsers, simulated users.

    TOOLS          tool name -> Tool class (built-ins: calculator, python, notepad, gsm8k_answer)
    TOOL_PARSERS   format name -> parser (hermes: <tool_call>{json}</tool_call>)
    INTERACTIONS   name -> simulated user (fixed_reply, gsm8k_retry)
    verl_files     verl's tool-config / interaction-config YAML files -> the above

The loop itself (`rlkit.rollout.agent.loop.AgentLoop`) and the batching server
(`rlkit.rollout.agent.engine.BatchingServer`) import torch; they are not imported here
so the config can import `MultiTurnConfig` cheaply. Guide: docs/agents.md.
"""

from rlkit.config.agent import MultiTurnConfig
from rlkit.rollout.agent.interaction import INTERACTIONS, Interaction, UserTurn
from rlkit.rollout.agent.parser import TOOL_PARSERS, ParsedTurn, ToolCall, ToolParser
from rlkit.rollout.agent.tools import TOOLS, Tool, ToolResult, build_tools, load_builtin_tools, run_tool

__all__ = [
    "INTERACTIONS",
    "TOOLS",
    "TOOL_PARSERS",
    "Interaction",
    "MultiTurnConfig",
    "ParsedTurn",
    "Tool",
    "ToolCall",
    "ToolParser",
    "ToolResult",
    "UserTurn",
    "build_tools",
    "load_builtin_tools",
    "run_tool",
]
