"""Check the agent names of `actor_rollout_ref.rollout.multi_turn` against the agent registries.

The config layer cannot (it imports no other rlkit layer); `rlkit train` runs this from its
finalize hooks and `AgentRollout` when it is built.
"""

from __future__ import annotations

from rlkit.config.agent import PREFIX, MultiTurnConfig
from rlkit.errors import UserError


def check_multi_turn(mt: MultiTurnConfig) -> None:
    """UserError naming the key for a tool, tool-call format or interaction that is not registered, or a verl
    tool/interaction file rlkit cannot run (no torch)."""
    from rlkit.rollout.agent.interaction import INTERACTIONS
    from rlkit.rollout.agent.parser import TOOL_PARSERS
    from rlkit.rollout.agent.tools import TOOLS, load_builtin_tools
    from rlkit.rollout.agent.verl_files import interaction_spec, tool_specs

    load_builtin_tools()
    if mt.tool_config_path is not None:
        tool_specs(mt.tool_config_path)
    if mt.interaction_config_path is not None:
        interaction_spec(mt.interaction_config_path)
    checks = [("format", TOOL_PARSERS, [mt.format])]
    checks.append(("tools", TOOLS, list(mt.tools)))
    checks.append(("tool_config", TOOLS, list(mt.tool_config)))
    if mt.interaction is not None:
        checks.append(("interaction", INTERACTIONS, [mt.interaction]))
    if mt.external_agent is not None:
        import rlkit.rollout.agent.external_agents  # noqa: F401  (registers the built-in ones)
        from rlkit.rollout.agent.openai_endpoint import EXTERNAL_AGENTS

        checks.append(("external_agent", EXTERNAL_AGENTS, [mt.external_agent]))
    for key, registry, names in checks:
        for name in names:
            if name not in registry:
                raise UserError(f"{PREFIX}{key}: '{name}' is not registered; choose from {registry.names()}")
