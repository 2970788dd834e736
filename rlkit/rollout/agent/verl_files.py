"""verl's tool-config and interaction-config YAML files, read into rlkit's tools and simulated users.

`multi_turn.tool_config_path` names a file of

    tools:
      - class_name: <an rlkit tool name, or a verl tool class in VERL_TOOLS>
        config: {type: native, ...}        # the tool's settings
        tool_schema: {type: function, function: {name, description, parameters}}

Each entry becomes one rlkit tool (`TOOLS`); its `tool_schema` is what the model sees and the name it
calls the tool by (the key of `tools_kwargs` too), and the rlkit tool runs the calls. The schema must
offer every parameter the rlkit tool requires. verl classes are mapped onto the rlkit tool that does the
same job (`VERL_TOOLS`: a function from the verl `config` to the rlkit tool name and its constructor
kwargs); verl tools without an rlkit counterpart (MCP servers, image tools) are refused.

`multi_turn.interaction_config_path` names a file of `interaction: [{name, class_name, config}]`;
rlkit runs one simulated user per run, so the file lists one (an rlkit `INTERACTIONS` name, or a verl
class in `VERL_INTERACTIONS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlkit.config.agent import PREFIX, MultiTurnConfig
from rlkit.errors import UserError
from rlkit.registry import Registry
from rlkit.rollout.agent.interaction import INTERACTIONS, Interaction
from rlkit.rollout.agent.tools import TOOLS, Tool, load_builtin_tools

Adapter = Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]
#: verl tool class -> (its config -> the rlkit tool name and constructor kwargs)
VERL_TOOLS: Registry[Adapter] = Registry("verl tool class")
#: verl interaction class -> (its config -> the rlkit interaction name and constructor kwargs)
VERL_INTERACTIONS: Registry[Adapter] = Registry("verl interaction class")


@VERL_TOOLS.register("verl.tools.sandbox_fusion_tools.SandboxFusionTool")
def _sandbox_fusion(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Code execution: rlkit's `python` runs it in the local sandbox (no service is called: `sandbox_fusion_url`,
    `num_workers`, `rate_limit`, `enable_global_rate_limit` have no use; `max_parallel_tools` bounds concurrency)."""
    language = config.get("default_language", "python")
    if language != "python":
        raise UserError(f"default_language '{language}': rlkit's python tool runs python only")
    return "python", {"wall_s": float(config.get("default_timeout", 30)),
                      "memory_mb": int(config.get("memory_limit_mb", 1024))}


@VERL_TOOLS.register("verl.tools.gsm8k_tool.Gsm8kTool")
def _gsm8k(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "gsm8k_answer", {}


@VERL_TOOLS.register("verl.tools.geo3k_tool.Geo3kTool")
def _geo3k(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The submitted answer graded against the row's ground truth (verl: mathruler's grade_answer; rlkit: the
    `math` scorer's symbolic equivalence)."""
    return "math_answer", {}


@VERL_TOOLS.register("verl.tools.search_tool.SearchTool")
def _search(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The same retrieval service, called one request per tool call (`num_workers`, `rate_limit` have no use:
    `multi_turn.max_parallel_tools` bounds concurrency)."""
    url = config.get("retrieval_service_url")
    if not url:
        raise UserError("config.retrieval_service_url is required (the retrieval service's /retrieve URL)")
    return "retrieval_search", {"url": url, "topk": int(config.get("topk", 3)),
                                "timeout_s": float(config.get("timeout", 30))}


@VERL_INTERACTIONS.register("verl.interactions.gsm8k_interaction.Gsm8kInteraction")
def _gsm8k_interaction(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Asks again after each wrong answer until a right one (the turn limits end it): strict `#### N`."""
    return "gsm8k_retry", {"max_retries": None, "method": "strict"}


@dataclass
class ToolSpec:
    """One tool to offer: the rlkit tool, its constructor kwargs, and the schema shown (None: its own)."""

    tool: str
    kwargs: dict[str, Any]
    schema: dict[str, Any] | None = None


def _entries(path: str, key: str, config_key: str) -> list[dict[str, Any]]:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{PREFIX}{config_key}={path}: cannot read it ({type(exc).__name__}: {exc})") from None
    entries = data.get(key) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{PREFIX}{config_key}={path}: expected a list of entries under '{key}:'")
    return entries


def _resolve(class_name: Any, names: Registry[Any], verl: Registry[Adapter], config: dict[str, Any],
             where: str) -> tuple[str, dict[str, Any]]:
    """(rlkit name, kwargs) of an entry's class_name: an rlkit name takes `config` as its kwargs."""
    if isinstance(class_name, str) and class_name in names:
        return class_name, config
    if isinstance(class_name, str) and class_name in verl:
        try:
            return verl.get(class_name)(config)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
    raise UserError(f"{where}: class_name '{class_name}' has no rlkit counterpart; use an rlkit {names.kind} "
                    f"({', '.join(names.names())}) or a verl class rlkit maps ({', '.join(verl.names())})")


def _check_schema(schema: Any, tool: type[Tool], where: str) -> dict[str, Any]:
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise UserError(f"{where}: tool_schema needs {{type: function, function: {{name, description, parameters}}}}")
    parameters = function.get("parameters") or {}
    offered = set(parameters.get("properties") or {}) if isinstance(parameters, dict) else set()
    missing = [p for p in tool.parameters.get("required", []) if p not in offered]
    if missing:
        raise UserError(f"{where}: tool_schema '{function['name']}' lacks the parameter(s) {missing} that rlkit's "
                        f"'{tool.name}' tool runs on; add them to its parameters.properties")
    return {"type": "function", **schema}


def tool_specs(path: str) -> list[ToolSpec]:
    """The tools of a verl tool-config file, checked (no tool is built)."""
    load_builtin_tools()
    specs: list[ToolSpec] = []
    shown: set[str] = set()
    for i, entry in enumerate(_entries(path, "tools", "tool_config_path")):
        where = f"{PREFIX}tool_config_path={path}: tools[{i}]"
        config = dict(entry.get("config") or {})
        kind = config.pop("type", "native")
        if kind != "native":
            raise UserError(f"{where}: config.type '{kind}' is not supported (rlkit runs native tools only)")
        name, kwargs = _resolve(entry.get("class_name"), TOOLS, VERL_TOOLS, config, where)
        schema = entry.get("tool_schema")
        if schema is not None:
            schema = _check_schema(schema, TOOLS.get(name), where)
        call_name = schema["function"]["name"] if schema is not None else TOOLS.get(name).name
        if call_name in shown:
            raise UserError(f"{where}: two tools are called '{call_name}'; give each its own tool_schema name")
        shown.add(call_name)
        specs.append(ToolSpec(name, kwargs, schema))
    return specs


def configured_tool_specs(mt: MultiTurnConfig) -> list[ToolSpec]:
    """The tools a run offers: the tool-config file's, else `multi_turn.tools` with `multi_turn.tool_config`."""
    if mt.tool_config_path is not None:
        return tool_specs(mt.tool_config_path)
    return [ToolSpec(name, dict(mt.tool_config.get(name) or {})) for name in mt.tools]


def build_configured_tools(mt: MultiTurnConfig) -> dict[str, Tool]:
    """The run's tool instances, keyed by the name the model calls each by."""
    load_builtin_tools()
    tools: dict[str, Tool] = {}
    for spec in configured_tool_specs(mt):
        tool = TOOLS.get(spec.tool)(**spec.kwargs)
        if spec.schema is not None:
            tool = tool.with_schema(spec.schema)
        tools[tool.function_name] = tool
    return tools


def interaction_spec(path: str) -> tuple[str, dict[str, Any]]:
    """(rlkit interaction name, constructor kwargs) of a verl interaction-config file."""
    entries = _entries(path, "interaction", "interaction_config_path")
    where = f"{PREFIX}interaction_config_path={path}"
    if len(entries) != 1:
        raise UserError(f"{where}: lists {len(entries)} interactions; rlkit runs one simulated user per run, "
                        "keep one entry")
    entry = entries[0]
    return _resolve(entry.get("class_name"), INTERACTIONS, VERL_INTERACTIONS, dict(entry.get("config") or {}),
                    f"{where}: interaction[0]")


def build_configured_interaction(mt: MultiTurnConfig) -> Interaction | None:
    """The run's simulated user: the interaction-config file's, else `multi_turn.interaction`, else None."""
    if mt.interaction_config_path is not None:
        name, kwargs = interaction_spec(mt.interaction_config_path)
    elif mt.interaction is not None:
        name, kwargs = mt.interaction, dict(mt.interaction_config)
    else:
        return None
    return INTERACTIONS.get(name)(**kwargs)
