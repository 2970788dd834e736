"""What a model spec names: a local HF folder, a `.gguf` file (converted once), a registered alias or a
hub id. The one entry point every role uses (`resolve_model_path`), above both the alias table and the
loading/conversion helpers, so neither of those imports the other's caller.
"""

from __future__ import annotations

from pathlib import Path

from rlkit.errors import UserError
from rlkit.models import aliases as model_aliases
from rlkit.models import hub
from rlkit.models.loading import HUB_ID, Progress, ResolvedModel, check_hf_folder, convert_gguf


def _noop(_: str) -> None:
    pass


def resolve_model_path(spec: str | Path, cache_dir: str | Path | None = None) -> Path:
    """A local HF folder (with config.json) for `spec`; see `resolve_model`."""
    return resolve_model(spec, cache_dir).path


def resolve_model(
    spec: str | Path, cache_dir: str | Path | None = None, progress: Progress | None = None
) -> ResolvedModel:
    """Resolve a folder, a `.gguf` file, a registered alias or a hub id `org/name`.

    Raises UserError naming what was tried and how to fix it.
    """
    progress = progress or _noop
    text = str(spec)
    path = Path(text).expanduser()
    if path.exists():
        if path.is_dir():
            return ResolvedModel(check_hf_folder(path), "local folder")
        if path.suffix.lower() == ".gguf":
            return convert_gguf(path, cache_dir, progress=progress)
        raise UserError(f"{path} is a file but not a .gguf; pass an HF model folder (with config.json) or a .gguf file")
    if text in model_aliases.ALIASES:
        return model_aliases.resolve_alias(text, cache_dir, progress)
    if path.suffix.lower() == ".gguf" or text.startswith((".", "/", "~")) or not HUB_ID.match(text):
        close = model_aliases.close_aliases(text)
        hint = f" Did you mean alias {close[0]!r}?" if close else ""
        raise UserError(
            f"model {text!r}: no such file or folder, and not a known alias ({', '.join(model_aliases.ALIASES)}) "
            f"or hub id (org/name).{hint} See `rlkit model list`."
        )
    return _resolve_hub_id(text, progress)


def _resolve_hub_id(repo_id: str, progress: Progress) -> ResolvedModel:
    cached = hub.cached_snapshot(repo_id)
    if cached is not None:
        return ResolvedModel(cached, "hf cache")
    if not hub.hub_reachable():
        why = "offline mode is set (HF_HUB_OFFLINE/RLKIT_OFFLINE)" if hub.hub_offline() else "the hub is unreachable"
        raise UserError(
            f"model {repo_id!r}: not in the local HF cache and {why} ({hub.hub_endpoint()}). "
            f"Fix: run `rlkit model pull {repo_id}` on a machine with network and copy ~/.cache/huggingface, "
            "or pass a local folder with config.json or a .gguf file."
        )
    progress(f"downloading {repo_id} from {hub.hub_endpoint()}")
    try:
        return ResolvedModel(check_hf_folder(hub.download_snapshot(repo_id)), "hub")
    except UserError:
        raise
    except Exception as exc:  # repo not found, gated, network dropped mid-way
        raise UserError(f"model {repo_id!r}: download from the hub failed: {exc}") from None
