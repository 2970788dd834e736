"""Compose and validate a run config: schema defaults <- algorithm preset <- --config file <- key=value overrides.

Configs are OmegaConf (the YAML/interpolation engine under Hydra) over the typed
schema in `config_schema.py`. Every problem is a UserError that names the key,
and for unknown keys the closest valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlkit.config.schema import RLConfig
from rlkit.errors import UserError

PRESET_PACKAGE = "rlkit.config.presets"


def preset_names() -> list[str]:
    files = resources.files(PRESET_PACKAGE).iterdir()
    return sorted(p.name[:-5] for p in files if p.name.endswith(".yaml") and not p.name.startswith("_"))


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


def _field_default(fld: dataclasses.Field) -> Any:
    if fld.default is not dataclasses.MISSING:
        return fld.default
    if fld.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return fld.default_factory()  # type: ignore[misc]
    return None


def _check_known(cfg: dict, source: str, known: set[str], prefix: str = "") -> None:
    """Raise for the first key that the schema does not know, suggesting the closest ones."""
    all_keys = sorted(known)
    for key, value in cfg.items():
        dotted = f"{prefix}{key}"
        if dotted in known:
            continue
        if isinstance(value, dict) and any(k.startswith(dotted + ".") for k in known):
            _check_known(value, source, known, dotted + ".")
            continue
        close = difflib.get_close_matches(dotted, all_keys, n=3, cutoff=0.5)
        leaf = dotted.rsplit(".", 1)[-1]
        close += [k for k in all_keys if k.endswith("." + leaf) and k not in close][:3]
        hint = f" Closest valid keys: {', '.join(close)}." if close else ""
        raise UserError(f"unknown config key '{dotted}' (from {source}).{hint}")


def _parse_overrides(overrides: list[str]) -> dict:
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override '{item}' is not key=value (example: actor_rollout_ref.rollout.n=4)")
        key, value = item.split("=", 1)
        key = key.lstrip("+")
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]))["v"]  # type: ignore[index]
        except OmegaConfBaseException as exc:
            raise UserError(f"override '{item}': cannot parse the value ({exc})") from None
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = parsed
    return out


def compose_config(algo: str = "grpo", overrides: list[str] | None = None, config_file: str | None = None) -> RLConfig:
    """The validated RLConfig of `rlkit train ALGO [--config FILE] [key=value ...]`, not finalized (see finalize)."""
    if algo not in preset_names():
        close = difflib.get_close_matches(algo, preset_names(), n=2)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise UserError(f"unknown algorithm preset '{algo}'. Known: {', '.join(preset_names())}.{hint}")
    known = set(schema_keys())
    layers: list[tuple[str, dict]] = []
    preset_text = resources.files(PRESET_PACKAGE).joinpath(f"{algo}.yaml").read_text()
    layers.append((f"preset {algo}.yaml", OmegaConf.to_container(OmegaConf.create(preset_text)) or {}))
    if config_file:
        path = Path(config_file).expanduser()
        if not path.is_file():
            what = "is a directory; pass a YAML file" if path.is_dir() else "does not exist"
            raise UserError(f"config file {path} {what}")
        try:
            layers.append((str(path), OmegaConf.to_container(OmegaConf.load(path)) or {}))
        except OmegaConfBaseException as exc:
            raise UserError(f"{path}: not valid YAML ({exc})") from None
    layers.append(("command line", _parse_overrides(overrides or [])))
    merged: DictConfig = OmegaConf.structured(RLConfig)
    for source, layer in layers:
        if not isinstance(layer, dict):
            raise UserError(f"{source}: the top level must be a mapping of config groups")
        _check_known(layer, source, known)
        try:
            merged = OmegaConf.merge(merged, layer)  # type: ignore[assignment]
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", "") or "?"
            detail = str(exc).splitlines()[0]
            raise UserError(f"bad value for '{key}' (from {source}): {detail}") from None
    try:
        cfg: RLConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise UserError(f"config: {exc}") from None
    return cfg


def to_yaml(cfg: RLConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: RLConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))  # type: ignore[return-value]

