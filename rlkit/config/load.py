"""Compose a run config with Hydra's compose API, then validate it against the typed schema.

Layers, later ones win:

1. the schema defaults (`schema.py`; stored in Hydra's ConfigStore as `rlkit_schema`);
2. the algorithm preset, the Hydra config group `algorithm` (`conf/algorithm/<name>.yaml`,
   each `# @package _global_` because a preset sets keys of several sections);
3. the user's config: `--config FILE` (one YAML file), or a YAML tree as verl's main_ppo
   loads one, `--config-path DIR --config-name NAME` (NAME.yaml may use its own groups in DIR;
   rlkit's `conf/` is on the search path, so its defaults list may name `rlkit`);
4. the overrides, in Hydra's grammar: `key=v`, `+key=v` (add), `++key=v` (add or set),
   `~key` (delete: the key falls back to its schema default), lists `[a,b]`, dicts `{k: v}`,
   `${interpolation}`. Two conveniences keep run scripts that worked before working: a plain
   `key=v` under a free-form mapping (e.g. `reward_model.scorer_kwargs.gsm8k.method=flexible`)
   is applied as `++key=v`, and a value Hydra's grammar cannot read (`~/data/x.parquet`,
   `http://host:8000/v1?x=1`, or items of a flat list: `[actor.update_policy:step=2,critic.update]`)
   is read as the string(s) it spells.

Hydra is used as a library: no `@hydra.main`, no working-directory change, no log files.
Validation keeps rlkit's error quality: an unknown key names the closest valid ones, a bad
value names the key and where it came from, each as one `UserError` line.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlkit.config.schema import REMOVED_KEYS, RLConfig
from rlkit.config.verl_keys import VERL_KEYS
from rlkit.config.verl_rules import VerlKey
from rlkit.config.verl_translate import CLI, VerlReader, is_known, translate_overrides
from rlkit.errors import UserError

CONF_DIR = Path(__file__).resolve().parent / "conf"
BASE = "rlkit"  # conf/rlkit.yaml: schema defaults + the algorithm group
SCHEMA_NODE = "rlkit_schema"
RUN_NODE = "_rlkit_run"  # generated primary config when a user config sits over the base
FILE_NODE = "_rlkit_config_file"  # the content of --config FILE
MAIN_PPO = "_main_ppo"  # the preset of `rlkit train` without one: verl's main_ppo defaults (adv_estimator gae)
VERL_BASES = ("ppo_trainer", "ppo_megatron_trainer")  # verl's built-in config names, as rlkit's base


@dataclass(frozen=True)
class ConfigSpace:
    """What one family of runs composes: its typed schema, its base YAML (conf/<base>.yaml, listing `schema_node`),
    verl's keys around the schema, and whether an `algorithm` preset group is chosen (RL) or not (SFT)."""

    schema: type
    base: str
    schema_node: str
    rules: Sequence[VerlKey]
    verl_bases: tuple[str, ...] = ()  # verl's config names that stand for the base (`--config-name ppo_trainer`)
    presets: bool = True
    removed: Mapping[str, str] = field(default_factory=dict)


#: `rlkit train [ALGO]`: the RL schema, conf/rlkit.yaml and the algorithm presets
RL_SPACE = ConfigSpace(RLConfig, BASE, SCHEMA_NODE, VERL_KEYS, VERL_BASES, True, REMOVED_KEYS)


# ----------------------------------------------------------------------------------------- schema
def preset_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml") if not p.stem.startswith("_"))


def schema_keys(cls: type = RLConfig, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema (dict-valued fields count as leaves)."""
    keys = []
    for fld in dataclasses.fields(cls):
        name = prefix + fld.name
        default = _field_default(fld)
        if dataclasses.is_dataclass(default):
            keys.extend(schema_keys(type(default), name + "."))
        else:
            keys.append(name)
    return keys


def mapping_keys(cls: type = RLConfig, prefix: str = "") -> list[str]:
    """Schema keys whose value is a free-form mapping (anything may be set below them)."""
    out = []
    for fld in dataclasses.fields(cls):
        default = _field_default(fld)
        if dataclasses.is_dataclass(default):
            out.extend(mapping_keys(type(default), prefix + fld.name + "."))
        elif isinstance(default, dict):
            out.append(prefix + fld.name)
    return out


def _field_default(fld: dataclasses.Field) -> Any:
    if fld.default is not dataclasses.MISSING:
        return fld.default
    if fld.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return fld.default_factory()  # type: ignore[misc]
    return None


def unknown_key_error(dotted: str, source: str, known: Iterable[str],
                      removed: Mapping[str, str] = REMOVED_KEYS) -> UserError:
    """'unknown config key X (from SOURCE). Closest valid keys: ...' (by spelling, then by the last name);
    a removed key says so and what to do instead."""
    if dotted in removed:
        return UserError(f"config key '{dotted}' (from {source}) was removed: {removed[dotted]}; delete it")
    all_keys = sorted(known)
    close = difflib.get_close_matches(dotted, all_keys, n=3, cutoff=0.5)
    leaf = dotted.rsplit(".", 1)[-1]
    close += [k for k in all_keys if k.endswith("." + leaf) and k not in close][:3]
    hint = f" Closest valid keys: {', '.join(close)}." if close else ""
    return UserError(f"unknown config key '{dotted}' (from {source}).{hint}")


def _check_known(cfg: dict, source: Any, known: set[str], prefix: str = "",
                 removed: Mapping[str, str] = REMOVED_KEYS) -> None:
    """Raise for the first key the schema does not know; `source` is a name or a key -> name function."""
    for key, value in cfg.items():
        dotted = f"{prefix}{key}"
        if dotted in known:
            continue
        if isinstance(value, dict) and any(k.startswith(dotted + ".") for k in known):
            _check_known(value, source, known, dotted + ".", removed)
            continue
        raise unknown_key_error(dotted, source(dotted) if callable(source) else source, known, removed)


# ----------------------------------------------------------------------------------------- overrides
def _parse_overrides(overrides: list[str]) -> list[Any]:
    """Hydra `Override` objects; a plain value Hydra's grammar cannot read is read as a string."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for item in overrides:
        try:
            parsed.append(parser.parse_override(item))
            continue
        except HydraException as exc:
            reason = str(exc).splitlines()[0]
        key, eq, value = item.partition("=")
        quoted = _as_strings(value) if eq and not key.startswith("~") else None
        if quoted is not None:
            try:
                parsed.append(parser.parse_override(f"{key}={quoted}"))
                continue
            except HydraException:
                pass
        example = " (example: actor_rollout_ref.rollout.n=4)" if not eq and not item.startswith("~") else ""
        raise UserError(f"override '{item}' is not in Hydra's override grammar ({reason}){example}")
    return parsed


def _bool_key(schema: type, dotted: str) -> bool:
    """Whether `dotted` is a boolean field of `schema` (read from its default)."""
    node: Any = schema
    for part in dotted.split("."):
        fld = next((f for f in dataclasses.fields(node) if f.name == part), None) if dataclasses.is_dataclass(node) \
            else None
        if fld is None:
            return False
        node = _field_default(fld)
        node = type(node) if dataclasses.is_dataclass(node) else node
    return isinstance(node, bool)


def _empty_bools(parsed: list[Any], schema: type, verl: VerlReader) -> list[Any]:
    """`key=` with nothing after it (a run script's shell variable left unset) for a boolean key: false, as verl's
    untyped config reads an empty value, with a line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for o in parsed:
        key = o.key_or_group
        if key and not o.is_delete() and o.value() == "" and _bool_key(schema, key.lstrip("+")):
            verl.say([f"verl key {key}= (empty) -> {key}=false (verl reads an empty value as false)"])
            o = OverridesParser.create().parse_override(o.input_line + "false")
        out.append(o)
    return out


def _as_strings(value: str) -> str | None:
    """`value` quoted as a string, or a flat list `[a,b]` with each item quoted (None: not that simple).
    For what Hydra's grammar cannot read unquoted: `~/x.parquet`, `[actor.update_policy:step=2,critic.update]`."""
    if any(c in value for c in "'\"") or ("{" in value or "}" in value) and value.count("{") == value.count("}"):
        return None  # quotes, or braces that may be a dict (a lone brace, e.g. `name=run_8npu}`, is text)
    if value.startswith("[") and value.endswith("]"):
        items = value[1:-1].split(",")
        if any(c in "".join(items) for c in "[]"):
            return None
        return "[" + ",".join(f"'{item.strip()}'" for item in items if item.strip()) + "]"
    return None if any(c in value for c in "[]") else f"'{value}'"


def _cli_layer(parsed: list[Any]) -> dict:
    """The key=value overrides as a nested dict (to say where a bad value came from)."""
    out: dict = {}
    for o in parsed:
        if o.is_delete() or not o.key_or_group or o.key_or_group == "algorithm":
            continue
        node = out
        parts = o.key_or_group.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else {}
        node[parts[-1]] = o.value()
    return out


def _hydra_overrides(algo: str | None, parsed: list[Any], known: set[str],
                     space: ConfigSpace = RL_SPACE) -> list[str]:
    """Check each override's key against the schema, then write the list Hydra composes with."""
    mappings = mapping_keys(space.schema)
    out = [f"algorithm={algo}"] if algo is not None else []
    for o in parsed:
        key = o.key_or_group
        if not key:
            raise UserError(f"override '{o.input_line}' names no key (example: actor_rollout_ref.rollout.n=4)")
        if key == "algorithm" or key.startswith("hydra."):
            if key == "algorithm" and not o.is_delete():
                raise UserError(f"override '{o.input_line}': the algorithm is the first argument "
                                f"(`rlkit train {o.value()} ...`), not an override")
            raise UserError(f"override '{o.input_line}' is not supported: rlkit composes the config itself")
        plain = not o.is_add() and not o.is_force_add()
        if plain and not is_known(key, known, mappings):  # +key / ++key may add; the result is checked below
            raise unknown_key_error(key, f"{CLI} '{o.input_line}'", known, space.removed)
        text = o.input_line
        if plain and not o.is_delete() and any(key == m or key.startswith(m + ".") for m in mappings):
            text = "++" + text  # a free-form mapping: ++ sets the entry whether or not it exists yet; the others stay
        out.append(text)
    return out


# ----------------------------------------------------------------------------------------- compose
def yaml_error(path: Path | str | None, exc: Exception) -> str:
    """A YAML parser's error as one line: `FILE:LINE:COLUMN: not valid YAML: what is wrong`."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = str(path or getattr(mark, "name", "config"))
    if mark is not None:
        where += f":{mark.line + 1}:{mark.column + 1}"
    what = " ".join(str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
    return f"{where}: not valid YAML: {what or str(exc).splitlines()[0]}"


def _user_yaml(path: Path) -> dict:
    """A user YAML file as a plain dict (its `defaults` and `hydra` keys left to Hydra)."""
    import yaml

    try:
        data = OmegaConf.to_container(OmegaConf.load(path)) or {}
    except yaml.YAMLError as exc:
        raise UserError(yaml_error(path, exc)) from None
    except OmegaConfBaseException as exc:
        raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping of config groups")
    return data


def _config_file(config_file: str) -> dict:
    path = Path(config_file).expanduser()
    if not path.is_file():
        what = "is a directory; pass a YAML file" if path.is_dir() else "does not exist"
        raise UserError(f"config file {path} {what}")
    return _user_yaml(path)


def _lists_base(defaults: Any, space: ConfigSpace = RL_SPACE) -> bool:
    """Whether a user defaults list already pulls in rlkit's base (verl style: `defaults: [rlkit, _self_]`)."""
    names = [d if isinstance(d, str) else next(iter(d), "") for d in defaults or [] if isinstance(d, str | dict)]
    return any(str(n).lstrip("/").split("@")[0] in (space.base, *space.verl_bases) for n in names)


def _store_nodes(file_layer: dict | None, user_name: str | None, base_listed: bool,
                 space: ConfigSpace = RL_SPACE) -> str:
    """Put the schema (and a generated primary config) in Hydra's ConfigStore; returns the primary's name."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    base = space.base
    store.store(name=space.schema_node, node=OmegaConf.to_container(OmegaConf.structured(space.schema)))
    if file_layer is not None:
        store.store(name=FILE_NODE, node=file_layer)
        store.store(name=RUN_NODE, node={"defaults": [base, FILE_NODE, "_self_"]})
        return RUN_NODE
    if user_name is None:
        return base
    if base_listed:
        return user_name
    store.store(name=RUN_NODE, node={"defaults": [base, user_name, "_self_"]})
    return RUN_NODE


def _compose(primary: str, config_dir: Path, overrides: list[str]) -> DictConfig:
    """Hydra's compose; its errors (and a YAML file of the user's tree that does not parse) as one line."""
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    if config_dir != CONF_DIR:
        overrides = [f"hydra.searchpath=[file://{CONF_DIR}]", *overrides]
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="rlkit"):
            return compose(config_name=primary, overrides=overrides)
    except yaml.YAMLError as exc:  # a file of the user's tree other than the primary (a group's option)
        raise UserError(yaml_error(None, exc)) from None
    except (HydraException, OmegaConfBaseException) as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, yaml.YAMLError):
            raise UserError(yaml_error(None, cause)) from None
        lines = [line.strip() for line in str(exc).splitlines() if line.strip() and "provider=" not in line]
        lines = [line for line in lines if not line.startswith("Config search path")]
        raise UserError(f"config: {' '.join(lines)}") from None


def compose_config(algo: str | None = "grpo", overrides: list[str] | None = None, config_file: str | None = None,
                   *, config_path: str | None = None, config_name: str | None = None,
                   notices: list[str] | None = None, space: ConfigSpace = RL_SPACE) -> Any:
    """Compose and validate the RLConfig of `rlkit train [ALGO] [...]`; not finalized (see `finalize`).

    Without a preset (`algo=None`) the run starts from verl's main_ppo defaults (rlkit's schema with
    `algorithm.adv_estimator: gae`). verl's keys are read as rlkit.config.verl_keys says; each mapped key's
    line is appended to `notices` (logged as a warning when no list is given). Another `space` (e.g. the SFT
    schema) composes its own schema and base the same way; without presets `algo` is ignored."""
    algo = (algo or MAIN_PPO) if space.presets else None
    if algo is not None and algo != MAIN_PPO and algo not in preset_names():
        close = difflib.get_close_matches(algo, preset_names(), n=2)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise UserError(f"unknown algorithm preset '{algo}'. Known: {', '.join(preset_names())}.{hint}")
    if config_file and (config_path or config_name):
        raise UserError("pass either --config FILE or --config-path DIR --config-name NAME, not both")
    if config_name and config_name.removesuffix(".yaml") in space.verl_bases:
        config_path, config_name = str(CONF_DIR), config_name.removesuffix(".yaml")
    elif bool(config_path) != bool(config_name):
        raise UserError("--config-path and --config-name go together (a folder and the name of a YAML file in it)")
    known = set(schema_keys(space.schema))
    verl = VerlReader(known, mapping_keys(space.schema), space.rules)
    parsed = translate_overrides(_empty_bools(_parse_overrides(list(overrides or [])), space.schema, verl), verl)
    layers: list[tuple[str, dict]] = []
    if algo is not None:
        layers.append((f"preset {algo}.yaml", _user_yaml(CONF_DIR / "algorithm" / f"{algo}.yaml")))
    file_layer, config_dir, base_listed = None, CONF_DIR, False
    if config_file:
        file_layer = _config_file(config_file)
        _check_known(verl.layer({k: v for k, v in file_layer.items() if k not in ("defaults", "hydra")},
                                config_file), config_file, known, removed=space.removed)
        layers.append((config_file, file_layer))
    if config_path and config_name:
        config_dir = Path(config_path).expanduser().resolve()
        primary_file = config_dir / f"{config_name.removesuffix('.yaml')}.yaml"
        if not primary_file.is_file():
            raise UserError(f"--config-name {config_name}: {primary_file} does not exist")
        user = _user_yaml(primary_file)
        base_listed = _lists_base(user.get("defaults"), space)
        _check_known(verl.layer({k: v for k, v in user.items() if k not in ("defaults", "hydra")}, str(primary_file)),
                     str(primary_file), known, removed=space.removed)
        layers.append((f"the config tree {config_dir}", user))
        config_name = primary_file.stem
    layers.append((CLI, _cli_layer(parsed)))
    primary = _store_nodes(file_layer, config_name, base_listed, space)
    composed = _compose(primary, config_dir, _hydra_overrides(algo, parsed, known, space))
    data = OmegaConf.to_container(composed)
    cfg = validate(verl.layer(data, "the composed config"), layers, known, space.schema, space.removed)
    _announce(verl.notices, notices)
    return cfg


def _announce(lines: list[str], sink: list[str] | None) -> None:
    if sink is not None:
        sink.extend(lines)
        return
    import logging

    for line in lines:
        logging.getLogger("rlkit.config").warning(line)


def _source_of(dotted: str, layers: list[tuple[str, dict]]) -> str:
    """The last layer that sets `dotted` (or a parent of it); the user's config tree when none does."""
    for source, layer in reversed(layers):
        node: Any = layer
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return source
    return next((s for s, _ in reversed(layers) if s.startswith("the config tree")), "config")


def validate(data: dict, layers: list[tuple[str, dict]], known: set[str] | None = None, schema: type = RLConfig,
             removed: Mapping[str, str] = REMOVED_KEYS) -> Any:
    """The composed dict as a typed `schema` (RLConfig): unknown keys and bad values name the key and their source."""
    known = known or set(schema_keys(schema))
    _check_known(data, lambda key: _source_of(key, layers), known, removed=removed)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), data)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or "?"
        detail = str(exc).splitlines()[0]
        raise UserError(f"bad value for '{key}' (from {_source_of(key, layers)}): {detail}") from None
    try:
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or "?"
        raise UserError(f"config: '{key}': {str(exc).splitlines()[0]}") from None


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))  # type: ignore[return-value]
