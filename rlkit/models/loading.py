"""Turn a model spec (folder, .gguf file, alias, hub id) into a local HF folder, and load it.

Every consumer (FSDP workers, vLLM, the HF rollout, `rlkit model`) wants a plain HF folder
on local disk, so this is the one place that knows about other forms. A GGUF file is
dequantized once into `<cache>/<name>-<hash>/` and reused afterwards: conversion takes tens
of seconds, and workers on one node resolve the same spec concurrently, so it runs under a
file lock, writes into a temp dir and publishes it with an atomic rename.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
MARKER = "rlkit_model.json"  # written last into a converted folder: its source and fingerprint
CONVERT_FORMAT = 1  # bump when the conversion output changes, so old caches are not reused
WEIGHT_GLOBS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MAX_JSON_CHECK_BYTES = 64 << 20  # bigger JSON files (none in usual model folders) are not parsed up front
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "half": "float16"}


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    source: str  # human-readable: "local folder", "gguf (cached)", "hub", ...


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where converted models live: `cache_dir`, else `$RLKIT_CACHE_DIR`, else `~/.cache/rlkit/models`."""
    root = cache_dir or os.environ.get("RLKIT_CACHE_DIR") or Path.home() / ".cache" / "rlkit" / "models"
    return Path(root).expanduser()


def _noop(_: str) -> None:
    pass


def check_hf_folder(path: Path) -> Path:
    """`path` if it looks loadable (config.json + weights); UserError naming the path otherwise."""
    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json, so it is not a Hugging Face model folder; pass the folder "
                        "holding config.json and the weights, a .gguf file, or an alias (`rlkit model list`)")
    for file in sorted(path.glob("*.json")):  # config, tokenizer, generation config: each must parse
        if file.stat().st_size > MAX_JSON_CHECK_BYTES:
            continue
        try:  # an unreadable file raises OSError, which names the file and the cause on its own
            json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UserError(f"{file} line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg}); the model "
                            "folder is damaged: download or copy it again") from None
        except UnicodeDecodeError as exc:
            raise UserError(f"{file}: not valid UTF-8 text ({exc.reason} at byte {exc.start}); the model folder "
                            "is damaged: download or copy it again") from None
    if not any(next(path.glob(g), None) for g in WEIGHT_GLOBS):
        raise UserError(f"{path} has config.json but no weights (*.safetensors or pytorch_model*.bin)")
    return path


# ---------------------------------------------------------------- GGUF -> HF folder cache


def gguf_fingerprint(path: Path, dtype: str = "bfloat16") -> str:
    """A cheap content key: size + first and last MiB + conversion settings (no full-file hash)."""
    h = hashlib.sha256(f"{CONVERT_FORMAT}:{dtype}:{path.stat().st_size}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:12]


def _check_gguf(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UserError(f"{path} is not a GGUF file (bad magic {magic!r}); the file is corrupt or a partial download")


def _safe_name(name: str) -> str:
    return re.sub(r"[^\w.-]+", "-", name).strip("-.") or "model"


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def convert_gguf(
    gguf_path: str | Path,
    cache_dir: str | Path | None = None,
    name: str | None = None,
    alias: str | None = None,
    dtype: str = "bfloat16",
    progress: Progress | None = None,
    source: str | None = None,
) -> ResolvedModel:
    """Dequantize `gguf_path` into a cached HF folder (once) and return it.

    `source` is what the cache listing shows as provenance (default: the file's path).

    bfloat16 by default: the rounding it adds is far below the 4-bit quantization noise already
    in the file, and it halves the cache.
    """
    progress = progress or _noop
    src = Path(gguf_path).expanduser().resolve()
    if not src.is_file():
        raise UserError(f"GGUF file {src} does not exist")
    _check_gguf(src)
    dtype = DTYPES.get(dtype, dtype)
    root = cache_root(cache_dir)
    final = root / f"{_safe_name(name or src.stem)}-{gguf_fingerprint(src, dtype)}"
    if read_marker(final):
        return ResolvedModel(final, "gguf (cached)")
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{final.name}.lock"):
        if read_marker(final):  # another process converted it while we waited
            return ResolvedModel(final, "gguf (cached)")
        tmp = root / f".{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            start = time.monotonic()
            _convert_into(src, tmp, dtype, progress)
            marker = {"format": CONVERT_FORMAT, "source": source or str(src), "source_kind": "gguf", "alias": alias,
                      "name": name or src.stem, "dtype": dtype, "fingerprint": final.name.rsplit("-", 1)[-1],
                      "created": time.time(), "convert_seconds": round(time.monotonic() - start, 1)}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2))
            progress(f"publishing {final}")
            os.rename(tmp, final)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not read_marker(final):
                raise UserError(f"could not write the converted model to {root}: {exc}") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return ResolvedModel(final, "gguf (converted)")


def _convert_into(src: Path, out: Path, dtype: str, progress: Progress) -> None:
    """Config + tokenizer + dequantized weights of `src` into `out` as a plain HF folder.

    `from_pretrained(gguf_file=...)` gives a model that refuses `save_pretrained` (it carries a
    GGUF quantization config), so we build a fresh model from the GGUF's config on the meta
    device and assign the dequantized tensors to it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    try:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError as exc:  # pragma: no cover - depends on the transformers version
        raise UserError(f"this transformers version cannot read GGUF ({exc}); install transformers>=4.57") from None

    torch_dtype = getattr(torch, dtype)
    progress(f"reading config and tokenizer from {src.name}")
    try:
        config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    except Exception as exc:  # the GGUF readers raise struct/index/value errors on damaged files
        raise UserError(f"{src}: cannot read the GGUF metadata ({type(exc).__name__}: {exc}); "
                        "the file is corrupt, truncated or of an unsupported architecture") from None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    if getattr(config, "max_position_embeddings", None):
        tokenizer.model_max_length = config.max_position_embeddings
    if not tokenizer.chat_template:
        log.warning("%s carries no chat template; chat-formatted prompts will fail with this model", src)

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    progress(f"dequantizing {src.name} to {dtype}")
    try:
        tensors = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=model, torch_dtype=torch_dtype)
    except Exception as exc:
        raise UserError(f"{src}: cannot read the GGUF tensors ({type(exc).__name__}: {exc}); "
                        "the file is corrupt or truncated") from None
    result = model.load_state_dict(tensors["tensors"], strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise UserError(f"{src} lacks weights for {missing[:3]}{'...' if len(missing) > 3 else ''}; not a full model")
    if result.unexpected_keys:
        log.warning("ignored %d GGUF tensors with no place in the model: %s", len(result.unexpected_keys),
                    result.unexpected_keys[:3])
    model.generation_config = GenerationConfig.from_model_config(config)
    progress(f"writing HF folder ({dtype})")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX); elsewhere a no-op, the atomic rename still keeps the cache sane."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class CachedModel:
    path: Path
    size_bytes: int
    marker: dict[str, Any]


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def cached_models(cache_dir: str | Path | None = None) -> list[CachedModel]:
    """Converted folders in the cache (temp dirs and foreign folders skipped), newest first."""
    root = cache_root(cache_dir)
    if not root.is_dir():
        return []
    found = [(d, m) for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and (m := read_marker(d))]
    found.sort(key=lambda dm: dm[1].get("created", 0), reverse=True)
    return [CachedModel(d, folder_size(d), m) for d, m in found]


# ---------------------------------------------------------------- loading


def torch_dtype(dtype: Any) -> Any:
    """`"bf16"`/`"bfloat16"`/torch.dtype -> torch.dtype; `"auto"` passes through."""
    import torch

    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPES))} or auto")
    return getattr(torch, DTYPES[dtype])


def load_tokenizer(path: str | Path, padding_side: str = "left") -> Any:
    """AutoTokenizer with left padding (generation) and a pad token (falls back to EOS, with a warning)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise UserError(f"tokenizer in {path} has neither a pad nor an eos token; set pad_token in its config")
        warnings.warn(f"tokenizer in {path} has no pad token; using eos {tokenizer.eos_token!r}", stacklevel=2)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_image_processor(path: str | Path, settings: dict | None = None) -> Any:
    """A vision-language model's image processor (`settings`, e.g. min_pixels/max_pixels, over its folder's), or
    None for a text model. A family registered in `IMAGE_PROMPTS` under its full processor's class (Idefics3) gets
    that processor: its prompt expansion reads the processor's settings (`image_seq_len`)."""
    from transformers import AutoConfig, AutoImageProcessor

    from rlkit.data.image_prompts import IMAGE_PROMPTS
    from rlkit.models.vision import is_vision_model

    if not is_vision_model(AutoConfig.from_pretrained(str(path))):
        if settings:
            raise UserError(f"data.mm_processor_kwargs is set but {path} is a text model; remove it")
        return None
    if _full_processor_class(path) in IMAGE_PROMPTS:  # a family whose prompt expansion reads the full processor
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(str(path), **(settings or {}))
    return AutoImageProcessor.from_pretrained(str(path), **(settings or {}))


def _full_processor_class(path: str | Path) -> str | None:
    """The processor class a folder's `processor_config.json` names (None without one)."""
    file = Path(path) / "processor_config.json"
    if not file.is_file():
        return None
    return json.loads(file.read_text()).get("processor_class")


def load_causal_lm(path: str | Path, dtype: Any = "float32", device: Any = "cpu") -> Any:
    """AutoModelForCausalLM from a local folder in `dtype` on `device` (float32 by default: CPU training)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype))
    return model.to(device)
