"""Pre-flight checks of what the rollout engine will be asked to do: its extra arguments against the installed vLLM,
the model's architecture against the engine that loads it, its heads against the engine's tensor-parallel size,
prompt + response against the model's positions.

Each would otherwise fail after Ray and the workers started, inside the engine worker, with a traceback. None of
them imports vLLM (rlkit.rollout.vllm_args / vllm_arch read its installed source), and none runs for `rollout.name=hf`
but the length check, which only notes there (a RoPE model computes positions past its trained ones).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

ROLLOUT = "actor_rollout_ref.rollout"


def _vllm(p: Any) -> bool:
    return p.cfg.actor_rollout_ref.rollout.name == "vllm"


def check_engine_kwargs(p: Any) -> None:
    """`rollout.engine_kwargs.vllm`: each a keyword the installed vLLM takes; an older name mapped, with a note."""
    from rlkit.rollout.vllm_args import map_engine_kwargs

    kwargs = p.cfg.actor_rollout_ref.rollout.vllm_kwargs
    if not _vllm(p) or not kwargs:
        return
    try:
        _, notices = map_engine_kwargs(kwargs)
    except UserError as exc:
        p.problems.append(str(exc))
        return
    p.notes.extend(notices)


def architecture_problem(model_dir: Path, key: str) -> tuple[str | None, str | None]:
    """(problem, note) of loading the model at `model_dir` with the installed vLLM (`key`: the config key that
    chose vLLM): a problem when its model module cannot import here or vLLM dropped the architecture, a note
    when vLLM loads it through its Transformers backend."""
    from rlkit.models.context import text_config
    from rlkit.rollout.vllm_arch import missing_import, vllm_architectures
    from rlkit.rollout.vllm_args import vllm_version

    registry = vllm_architectures()
    config = text_config(model_dir)
    archs = [a for a in (config.get("architectures") or []) if isinstance(a, str)]
    if registry is None or not archs:
        return None, None
    arch, version = archs[0], vllm_version()
    head_problem = cpu_head_size_problem(config, model_dir, key, version)
    if head_problem:
        return head_problem, None
    module = registry.modules.get(arch)
    if module is None:
        if arch in registry.dropped:
            return (f"{key}=vllm: vLLM {version} no longer supports the architecture {arch} of {model_dir}; use "
                    f"{ROLLOUT}.name=hf"), None
        return None, f"vLLM {version} has no own implementation of {arch}: it loads it through its Transformers backend"
    found = missing_import(f"vllm.model_executor.models.{module}")
    if found is None:
        return None, None
    package, chain = found
    return (f"{key}=vllm: vLLM {version} cannot load {arch} ({model_dir}) here: its model module imports "
            f"'{package}' (via {' -> '.join(chain)}), which is not installed; use {ROLLOUT}.name=hf (or an "
            "Idefics3/SmolVLM-architecture model, docs/vlm.md)"), None


def cpu_head_size_problem(config: dict[str, Any], model_dir: Path, key: str, version: str) -> str | None:
    """Without CUDA vLLM runs its CPU attention, which takes only some head sizes (rlkit.rollout.vllm_arch)."""
    import torch

    from rlkit.rollout.vllm_arch import cpu_attention_head_sizes

    sizes = cpu_attention_head_sizes()
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads and "hidden_size" in config else None)
    if torch.cuda.is_available() or not sizes or not isinstance(head_dim, int) or head_dim in sizes:
        return None
    return (f"{key}=vllm: vLLM {version}'s CPU attention runs head sizes {', '.join(map(str, sizes))}; {model_dir} "
            f"has head_dim {head_dim}: use {ROLLOUT}.name=hf (or a model with a supported head size)")


def check_engine_architecture(p: Any) -> None:
    """The policy's architecture is one the installed vLLM can load here (without starting an engine)."""
    if p.model_dir is None or not _vllm(p):
        return
    problem, note = architecture_problem(p.model_dir, f"{ROLLOUT}.name")
    if problem:
        p.problems.append(problem)
    if note:
        p.notes.append(note)


def check_engine_tensor_parallel(p: Any) -> None:
    """vLLM splits the attention heads over `rollout.tensor_model_parallel_size` ranks: the query heads must divide
    evenly, and the key/value heads too (or be replicated: the size a multiple of them)."""
    from rlkit.models.context import text_config

    tp = p.cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    if p.model_dir is None or not _vllm(p) or tp <= 1:
        return
    config = text_config(p.model_dir)
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads") or heads
    key = f"{ROLLOUT}.tensor_model_parallel_size={tp}"
    if isinstance(heads, int) and heads % tp:
        p.problems.append(f"{key}: vLLM splits the {heads} attention heads of {p.model_dir} over the engine's ranks, "
                          f"and {tp} does not divide them; use a size that divides {heads}")
    elif isinstance(kv, int) and kv % tp and tp % kv:
        p.problems.append(f"{key}: the {kv} key/value heads of {p.model_dir} neither split over {tp} ranks nor "
                          f"replicate to them; use a size that divides {kv} or a multiple of it")


def length_problem(model_dir: Path, need: int, what: str, engine: bool) -> tuple[str | None, str | None]:
    """(problem, note) of sequences of `need` tokens (`what` names the keys that make it) on the model at
    `model_dir`: vLLM (`engine`) refuses an engine longer than the model's positions; a training forward only
    goes past the positions it was trained on (a note)."""
    from rlkit.models.context import context_length

    limit = context_length(model_dir)
    if limit is None or need <= limit:
        return None, None
    if engine and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") not in ("1", "true", "True"):
        return (f"{what} = {need} tokens, more than the {limit} positions of {model_dir} (max_position_embeddings, "
                "RoPE scaling and the tokenizer's model_max_length): vLLM refuses such an engine; lower them to "
                f"{limit} in total"), None
    return None, (f"{what} = {need} tokens, past the {limit} positions {model_dir} was trained with (its outputs "
                  "there are untrained)")


def check_positions(p: Any) -> None:
    """data.max_prompt_length + rollout.response_length (or rollout.max_model_len) within the model's positions."""
    if p.model_dir is None:
        return
    rollout = p.cfg.actor_rollout_ref.rollout
    what = (f"{ROLLOUT}.max_model_len" if rollout.max_model_len else
            f"data.max_prompt_length + {ROLLOUT}.response_length ({rollout.prompt_length} + {rollout.response_length})")
    problem, note = length_problem(p.model_dir, rollout.model_len, what, engine=_vllm(p))
    if problem:
        p.problems.append(problem)
    if note:
        p.notes.append(note)
