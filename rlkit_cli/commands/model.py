"""`rlkit model list|pull|info`: see the model aliases and the cache, fetch/convert now, summarize a model."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rlkit.models import aliases as model_aliases
from rlkit.models.hub import cached_snapshot
from rlkit.models.loading import ResolvedModel, cache_root, cached_models, folder_size
from rlkit.models.resolve import resolve_model
from rlkit_cli.errors import friendly_errors

console = Console(log_path=False)
CacheDir = Annotated[
    Path | None,
    typer.Option("--cache-dir", help="Converted-model cache (default $RLKIT_CACHE_DIR or ~/.cache/rlkit/models)."),
]
Spec = Annotated[str, typer.Argument(help="Alias, HF folder, .gguf file or hub id org/name.")]


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


@friendly_errors
def list_models(cache_dir: CacheDir = None) -> None:
    """List model aliases (and where each is available locally) and the converted-model cache.

    Example: [bold]rlkit model list[/bold]
    """
    cached = cached_models(cache_dir)
    aliases = Table(title="aliases", title_justify="left")
    for col in ("alias", "hub id", "fallback", "local copy"):
        aliases.add_column(col, overflow="fold")
    for name in model_aliases.ALIASES.names():
        alias = model_aliases.ALIASES.get(name)
        local = next((str(c.path) for c in cached if c.marker.get("alias") == name), None)
        local = local or (str(p) if (p := cached_snapshot(alias.hub_id)) else "[dim]not pulled[/dim]")
        fallback = f"pypi {alias.pypi_package}" if alias.pypi_package else "-"
        default = " [green](default)[/green]" if name == model_aliases.DEFAULT_MODEL else ""
        aliases.add_row(name + default, alias.hub_id, fallback, local)
    console.print(aliases)
    table = Table(title=f"converted cache: {cache_root(cache_dir)}", title_justify="left")
    for col in ("name", "size", "source", "path"):
        table.add_column(col, overflow="fold")
    for c in cached:
        table.add_row(str(c.marker.get("name")), human_size(c.size_bytes), str(c.marker.get("source")), str(c.path))
    console.print(table if cached else f"[dim]converted cache {cache_root(cache_dir)} is empty[/dim]")


@friendly_errors
def pull(spec: Spec = model_aliases.DEFAULT_MODEL, cache_dir: CacheDir = None) -> None:
    """Resolve a model now (download and/or convert a GGUF once) so later runs start offline and fast.

    Example: [bold]rlkit model pull smollm2-135m-instruct[/bold]
    """
    start = time.monotonic()
    with console.status(f"resolving {spec}") as status:
        resolved = resolve_model(spec, cache_dir, progress=lambda msg: (console.log(msg), status.update(msg)))
    took = time.monotonic() - start
    console.print(f"[green]ok[/green] {spec} -> {resolved.path}  ({resolved.source}, "
                  f"{human_size(folder_size(resolved.path))}, {took:.1f}s)")


def safetensors_summary(folder: Path) -> tuple[int, set[str]]:
    """(parameter count, stored dtypes) from the safetensors headers, without loading any weight."""
    params, dtypes = 0, set()
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for key, info in header.items():
            if key != "__metadata__":
                count = 1
                for dim in info["shape"]:
                    count *= dim
                params += count
                dtypes.add(info["dtype"])
    return params, dtypes


def model_summary(resolved: ResolvedModel) -> dict[str, Any]:
    folder = resolved.path
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config)
    params, dtypes = safetensors_summary(folder)
    tok_cfg = folder / "tokenizer_config.json"
    template = (folder / "chat_template.jinja").is_file() or (
        tok_cfg.is_file() and bool(json.loads(tok_cfg.read_text()).get("chat_template"))
    )
    return {
        "path": str(folder),
        "source": resolved.source,
        "architecture": ", ".join(config.get("architectures") or [config.get("model_type", "?")]),
        "parameters": f"{params / 1e6:.1f}M" if params else "unknown (no safetensors)",
        "layers": text.get("num_hidden_layers"),
        "hidden size": text.get("hidden_size"),
        "heads (q/kv)": f"{text.get('num_attention_heads')}/{text.get('num_key_value_heads')}",
        "vocab": text.get("vocab_size"),
        "max positions": text.get("max_position_embeddings"),
        "dtype": ", ".join(sorted(dtypes)) or config.get("dtype") or config.get("torch_dtype"),
        "tied embeddings": config.get("tie_word_embeddings"),
        "chat template": "yes" if template else "no",
        "disk size": human_size(folder_size(folder)),
    }


@friendly_errors
def info(spec: Spec = model_aliases.DEFAULT_MODEL, cache_dir: CacheDir = None) -> None:
    """Summarize a model: parameters, layers, vocab, dtype, chat template (resolves it first, like pull).

    Example: [bold]rlkit model info smollm2-135m-instruct[/bold]
    """
    with console.status(f"resolving {spec}") as status:
        resolved = resolve_model(spec, cache_dir, progress=lambda msg: (console.log(msg), status.update(msg)))
    table = Table(title=spec, title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in model_summary(resolved).items():
        table.add_row(key, str(value))
    console.print(table)


def register(app: typer.Typer) -> None:
    model_app = typer.Typer(
        help="Model aliases and the local model cache. Example: [bold]rlkit model pull smollm2-135m-instruct[/bold]",
        no_args_is_help=True,
        rich_markup_mode="rich",
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    model_app.command("list")(list_models)
    model_app.command("pull")(pull)
    model_app.command("info")(info)
    app.add_typer(model_app, name="model")
