"""Pre-flight: the checks `rlkit train` (and `--dry-run`) runs before Ray starts.

A problem found here costs a second; found by a worker it costs the model load, and an
unwritable checkpoint folder found when the run first saves costs every step before it. Each
check is a function in CHECKS that reads the config and adds problems (one line each, naming the
key, the path and the fix) or notes to the report; all of them run, so one pass shows every problem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.algo.run_needs import critic_enabled
from rlkit.config.schema import RLConfig
from rlkit.errors import UserError
from rlkit.trainer.run.preflight_engine import (
    check_engine_architecture,
    check_engine_kwargs,
    check_engine_tensor_parallel,
    check_positions,
)
from rlkit.utils.fs_checks import free_bytes, human_bytes, writable_dir_problem

BYTES_PER_PARAM_IN_CHECKPOINT = 4 + 8  # fp32 weights + AdamW's two fp32 moments (what FSDPModel.save writes)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass
class Preflight:
    cfg: RLConfig
    allow_download: bool = True  # False in --dry-run: an uncached model is a note, not a download
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_dir: Path | None = None
    train_rows: int | None = None  # rows of data.train_files the run reads (after train_max_samples and filtering)


Check = Callable[[Preflight], None]


def log_dir_of(cfg: RLConfig) -> str:
    """trainer.log_dir, or its default `<trainer.default_local_dir>/logs`."""
    return cfg.trainer.log_dir or os.path.join(os.path.expanduser(cfg.trainer.default_local_dir), "logs")


def check_data(p: Preflight) -> None:
    """Every data file exists, opens (parquet, .jsonl, .json), has rows and the prompt column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlkit.data.dataset import expand_files
    from rlkit.data.table_files import is_json_file, read_json_table

    d = p.cfg.data
    for key, files in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        if files is None or files == []:
            if key == "data.train_files":
                p.problems.append(f"{key}: no data files given; pass a .parquet file (make one with `rlkit data`)")
            continue
        try:
            paths = expand_files(files)
        except UserError as exc:
            p.problems.append(f"{key}: {exc}")
            continue
        for path in paths:
            if not path.is_file():
                why = "is a folder without .parquet files" if path.is_dir() else "does not exist"
                p.problems.append(f"{key}: {path} {why}; fix the path or make it with `rlkit data NAME --out DIR`")
                continue
            try:
                if is_json_file(path):  # JSON Lines / JSON rows (rlkit.data.table_files)
                    table = read_json_table(path)
                    columns, rows = table.column_names, table.num_rows
                else:
                    meta = pq.ParquetFile(path)
                    columns, rows = meta.schema_arrow.names, meta.metadata.num_rows
            except UserError as exc:
                p.problems.append(f"{key}: {exc}")
                continue
            except (pa.ArrowException, OSError) as exc:
                first = (str(exc).splitlines() or [type(exc).__name__])[0]
                p.problems.append(f"{key}: {path} is not a readable parquet file ({first}); regenerate it with "
                                  "`rlkit data`")
                continue
            if d.prompt_key not in columns:
                p.problems.append(f"{key}: {path} has no '{d.prompt_key}' column (it has {', '.join(columns)}); "
                                  "set data.prompt_key or regenerate it with `rlkit data`")
            elif rows == 0:
                p.problems.append(f"{key}: {path} has no rows")
            elif key == "data.train_files":
                p.train_rows = (p.train_rows or 0) + rows
    if p.train_rows is not None and d.train_max_samples is not None and d.train_max_samples > 0:
        p.train_rows = min(p.train_rows, d.train_max_samples)


def check_dataset(p: Preflight) -> None:
    """The data files load as the run's dataset does (schema, chat template, prompt lengths against
    data.max_prompt_length and data.truncation): the same error before Ray starts as the run's after."""
    from rlkit.data import RLDataset
    from rlkit.data.user_dataset import rl_dataset_keys
    from rlkit.models.loading import load_image_processor, load_tokenizer

    d = p.cfg.data
    if p.model_dir is None or any(x.startswith("data.") for x in p.problems):
        return
    tokenizer = load_tokenizer(str(p.model_dir))
    try:  # a vision-language model's processor: image rows load as the run's dataset loads them
        images = load_image_processor(str(p.model_dir), d.mm_processor_kwargs)
    except UserError as exc:
        p.problems.append(f"data.mm_processor_kwargs: {exc}")
        return
    keys = rl_dataset_keys(d, images)
    for key, files, limit in (("data.train_files", d.train_files, d.train_max_samples),
                              ("data.val_files", d.val_files, d.val_max_samples)):
        if not files:
            continue
        try:
            dataset = RLDataset(files, tokenizer, d.max_prompt_length, d.truncation, d.prompt_key,
                                max_samples=limit, **keys)
        except UserError as exc:
            p.problems.append(f"{key}: {exc}")
            continue
        if key == "data.train_files":
            p.train_rows = len(dataset)  # what filter_overlong_prompts left
            if images is not None:
                _check_image_rows(p, dataset, key)


def check_batch_rows(p: Preflight) -> None:
    """One generation batch fits in the training rows (the loader drops a last partial batch, verl's drop_last)."""
    from rlkit.trainer.run.preflight_data import batch_rows_problem

    d = p.cfg.data
    key = "data.gen_batch_size" if d.gen_batch_size != d.train_batch_size else "data.train_batch_size"
    problem = batch_rows_problem(p.train_rows, d.gen_batch_size, key, "prompts")
    if problem:
        p.problems.append(problem)


def _check_image_rows(p: Preflight, dataset: Any, key: str) -> None:
    """Image rows need a single-turn rollout (the agent loop passes no images), and a vision-language model
    trained on several workers needs an image in every training row: the vision
    tower's FSDP units gather their weights only on ranks whose micro-batch has images, so a rank with none would
    wait forever on the others (mixed text/image data on one worker is fine)."""
    from rlkit.data.images import ENGINE_INPUTS

    if ENGINE_INPUTS not in dataset.columns:
        return
    if p.cfg.actor_rollout_ref.rollout.multi_turn.enable:  # the agent loop hands the engine token ids alone
        p.problems.append(f"{key}: images with rollout.multi_turn.enable=true: rlkit's agent loop does not pass "
                          "images to the engine yet (it would generate without them); use a single-turn rollout "
                          "(multi_turn.enable=false) for a vision-language model")
        return
    workers = p.cfg.trainer.n_gpus_per_node * p.cfg.trainer.nnodes
    if workers <= 1:
        return
    for i in range(len(dataset)):
        if not (dataset[i].get(ENGINE_INPUTS) or {}).get("image"):
            p.problems.append(f"{key}: row {i} has no image, and a vision-language model on {workers} workers needs "
                              "one in every training row; drop the text-only rows or train on one worker "
                              "(trainer.n_gpus_per_node=1)")
            return


def _cached_model(spec: str) -> Path | None:
    """The local folder of an alias or hub id if it is already on disk (no network)."""
    from rlkit.models import hub
    from rlkit.models.aliases import ALIASES, SourceUnavailable, from_converted_cache, from_hf_cache
    from rlkit.models.loading import cache_root

    if spec not in ALIASES:
        return hub.cached_snapshot(spec)
    for source in (from_converted_cache, from_hf_cache):
        try:
            return source(ALIASES.get(spec), cache_root(), lambda _: None).path
        except SourceUnavailable:
            continue
    return None


def model_folder(spec: str, allow_download: bool) -> tuple[Path | None, str | None]:
    """(the local folder of model `spec`, None) or (None, a note why it is not resolved yet): in a dry run an alias
    or hub id not on this machine, or a GGUF file, is resolved at start; a bad local path raises UserError."""
    from rlkit.models.aliases import ALIASES
    from rlkit.models.loading import HUB_ID
    from rlkit.models.resolve import resolve_model

    local = Path(spec).expanduser()
    remote = not local.exists() and (spec in ALIASES or HUB_ID.match(spec))
    if remote and not allow_download:
        folder = _cached_model(spec)
        why = f"model {spec} is not on this machine yet; `rlkit train` fetches it at start (or run `rlkit model " \
            f"pull {spec}`)"
        return folder, None if folder is not None else why
    if local.suffix.lower() == ".gguf" and not allow_download:
        return None, f"model {local}: GGUF, dequantized into the model cache at start"
    return resolve_model(spec).path, None


def check_model(p: Preflight) -> None:
    """actor_rollout_ref.model.path resolves to a folder with config.json and weights."""
    try:
        p.model_dir, why = model_folder(str(p.cfg.actor_rollout_ref.model.path), p.allow_download)
    except UserError as exc:
        p.problems.append(f"actor_rollout_ref.model.path: {exc}")
        return
    p.notes.append(why or f"model {p.model_dir}")


def check_teachers(p: Preflight) -> None:
    """distillation: each local teacher's model resolves (in a dry run, if on this machine) and holds prompt +
    response, which it scores whole (past its positions: a note)."""
    from rlkit.config.distillation import teachers
    from rlkit.trainer.run.preflight_engine import length_problem

    if not p.cfg.distillation.enabled:
        return
    rollout = p.cfg.actor_rollout_ref.rollout
    for name, teacher in teachers(p.cfg.distillation).items():
        if teacher.served:
            continue
        try:
            folder, why = model_folder(str(teacher.model_path), p.allow_download)
        except UserError as exc:
            p.problems.append(f"distillation.teacher_models.{name}.model_path: {exc}")
            continue
        if folder is None:
            p.notes.append(f"teacher {name}: {why}")
            continue
        _, note = length_problem(folder, rollout.model_len, f"prompt + response for teacher '{name}'", engine=False)
        p.notes.extend([note] if note else [])


def check_output_dirs(p: Preflight) -> None:
    """trainer.default_local_dir and the log dir exist (created here) and accept new files."""
    for key, path in (("trainer.default_local_dir", p.cfg.trainer.default_local_dir),
                      ("trainer.log_dir", log_dir_of(p.cfg))):
        problem = writable_dir_problem(path)
        if problem is not None:
            p.problems.append(f"{key}: {problem}; choose a writable folder")


def check_router_replay_model(p: Preflight) -> None:
    """actor.router_replay needs routers: a model whose config.json declares experts."""
    from rlkit.models.context import EXPERT_COUNT_KEYS, declares_experts

    if p.model_dir is None or not p.cfg.actor_rollout_ref.actor.router_replay:
        return
    if not declares_experts(p.model_dir):
        p.problems.append(f"actor_rollout_ref.actor.router_replay=true replays the routes of a mixture-of-experts "
                          f"model; {p.model_dir} declares no experts ({', '.join(EXPERT_COUNT_KEYS)} in its "
                          "config.json): set router_replay=false")


def check_expert_parallel_model(p: Preflight) -> None:
    """fsdp_config.expert_parallel_size > 1 splits a mixture-of-experts model's experts: the actor's model must
    declare experts, as many as a multiple of the size."""
    from rlkit.models.context import EXPERT_COUNT_KEYS, text_config

    if p.model_dir is None:
        return
    config = text_config(p.model_dir)
    experts = next((config[k] for k in EXPERT_COUNT_KEYS if isinstance(config.get(k), int) and config[k] > 1), None)
    arr = p.cfg.actor_rollout_ref
    for key, fsdp in (("actor_rollout_ref.actor", arr.actor.fsdp_config),
                      ("actor_rollout_ref.ref", arr.ref.fsdp_config)):
        ep = fsdp.expert_parallel_size
        if ep > 1 and experts is None:
            p.problems.append(f"{key}.fsdp_config.expert_parallel_size={ep} splits a mixture-of-experts model's "
                              f"experts; {p.model_dir} declares none: set expert_parallel_size=1")
        elif ep > 1 and experts % ep:
            p.problems.append(f"{key}.fsdp_config.expert_parallel_size={ep} must divide the model's {experts} "
                              f"experts; set a divisor of {experts}")


def _model_config(model_dir: Path) -> dict:
    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def lora_params_upper_bound(config: dict, rank: int) -> int:
    """Adapter parameters of rank `rank` on every linear layer of a decoder (attention q/k/v/o and a gated
    MLP): rank x (in + out) per layer (an upper bound when `target_modules` is narrower)."""
    h = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or (h // heads if heads else 0))
    kv = int(config.get("num_key_value_heads") or heads)
    inter = int(config.get("intermediate_size") or 4 * h)
    q, k = heads * head_dim, kv * head_dim
    per_layer = (h + q) + 2 * (h + k) + (q + h) + 3 * (h + inter)
    return rank * per_layer * int(config.get("num_hidden_layers") or 0)


def checkpoint_size(model_dir: Path, roles: int = 1, lora_rank: int = 0) -> int:
    """Bytes of one checkpoint, estimated from the model's weight files: parameters (from their size and
    dtype) x (fp32 weights + AdamW moments) x trained roles (actor, and critic when there is one).
    With LoRA the actor's checkpoint holds the adapter and its optimizer state only."""
    from rlkit.models.loading import WEIGHT_GLOBS

    weights = sum(f.stat().st_size for g in WEIGHT_GLOBS if not g.endswith(".json") for f in model_dir.glob(g))
    config = _model_config(model_dir)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    params = weights / DTYPE_BYTES.get(dtype, 2)
    actor = lora_params_upper_bound(config, lora_rank) if lora_rank > 0 else params
    return int((actor + params * (roles - 1)) * BYTES_PER_PARAM_IN_CHECKPOINT)


def check_disk(p: Preflight) -> None:
    """The checkpoint folder's disk has room for at least one checkpoint of this model."""
    if p.model_dir is None or any(x.startswith("trainer.default_local_dir") for x in p.problems):
        return
    roles = 2 if critic_enabled(p.cfg) else 1
    lora_rank = int(p.cfg.actor_rollout_ref.model.lora_rank or 0)
    need = checkpoint_size(p.model_dir, roles, lora_rank)
    root = p.cfg.trainer.default_local_dir
    free = free_bytes(root)
    what = "the LoRA adapter + its AdamW state" if lora_rank > 0 else "fp32 weights + AdamW state"
    if free < need:
        p.problems.append(
            f"trainer.default_local_dir: {Path(root).expanduser()} has {human_bytes(free)} free, but one checkpoint "
            f"of this model takes about {human_bytes(need)} ({what}"
            f"{', actor and critic' if roles == 2 else ''}); free space or point it at a bigger disk"
        )
    else:
        p.notes.append(f"checkpoint ~{human_bytes(need)} each ({what}), {human_bytes(free)} free")


def check_resume(p: Preflight) -> None:
    """An explicit trainer.resume_mode path names a loadable checkpoint."""
    from rlkit.utils.checkpoint_io import open_checkpoint

    mode = str(p.cfg.trainer.resume_mode)
    if mode in ("auto", "disable", "None"):
        return
    try:
        open_checkpoint(mode, "trainer.resume_mode")
    except UserError as exc:
        p.problems.append(str(exc))


def check_custom_reward(p: Preflight) -> None:
    """custom_reward_function.path imports and its signature is one the reward manager can call (per sample,
    rlkit.reward.custom; a manager with `check_custom`, e.g. `batch`, checks its own form)."""
    c = p.cfg.custom_reward_function
    if not c.path:
        return
    from rlkit.reward.custom import bind_custom, load_custom_fn
    from rlkit.reward.registry import reward_manager_class

    label = f"'{c.name}' in {c.path}"
    try:
        fn = load_custom_fn(c.path, c.name)
        check = getattr(reward_manager_class(p.cfg.reward_model.reward_manager), "check_custom", None)
        if check is not None:
            check(p.cfg, fn, label)
        else:
            bind_custom(fn, (p.cfg.reward_model.scorer_kwargs or {}).get("custom"), label)
    except UserError as exc:
        p.problems.append(str(exc))


def check_user_classes(p: Preflight) -> None:
    """data.sampler and data.custom_cls name importable classes (imported here as the trainer will)."""
    from rlkit.data.user_classes import load_user_object

    d = p.cfg.data
    for key, path, name in (("data.sampler", d.sampler.class_path, d.sampler.class_name),
                            ("data.custom_cls", d.custom_cls.path, d.custom_cls.name)):
        if path:
            try:
                load_user_object(path, name, key)
            except UserError as exc:
                p.problems.append(str(exc))


def check_trackers(p: Preflight) -> None:
    """Each tracker in trainer.logger has its package installed (found now, not after the workers load)."""
    from rlkit.utils.tracking import missing_tracker_packages

    p.problems.extend(missing_tracker_packages(p.cfg.trainer.logger))


def check_sequence_parallel(p: Preflight) -> None:
    """Ulysses SP splits the attention heads over the group: the model's head counts must allow it."""
    if p.model_dir is None:
        return
    config = _model_config(p.model_dir)
    heads = int(config.get("num_attention_heads") or 0)
    kv = int(config.get("num_key_value_heads") or heads)
    sizes = {
        "actor_rollout_ref.actor": p.cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size,
        "actor_rollout_ref.ref": p.cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size,
        "critic": p.cfg.critic.ulysses_sequence_parallel_size,
    }
    for key, sp in sizes.items():
        if sp > 1 and heads and heads % sp:
            p.problems.append(f"{key}.ulysses_sequence_parallel_size={sp} must divide the model's "
                              f"num_attention_heads={heads} (each worker of a group attends with heads/sp of them)")
        elif sp > 1 and kv % sp:
            p.notes.append(f"{key}.ulysses_sequence_parallel_size={sp}: the model's {kv} key/value heads do not split "
                           f"over {sp} workers; each worker repeats them up to the query heads (more traffic)")


CHECKS: list[Check] = [
    check_data, check_model, check_dataset, check_batch_rows, check_teachers, check_output_dirs, check_disk,
    check_resume, check_custom_reward, check_sequence_parallel, check_trackers, check_engine_kwargs,
    check_engine_architecture, check_engine_tensor_parallel, check_positions, check_router_replay_model,
    check_expert_parallel_model,
    check_user_classes,
]


def preflight(cfg: RLConfig, allow_download: bool = True) -> Preflight:
    """Run every check; UserError listing all problems (one per line) if there are any."""
    report = Preflight(cfg, allow_download)
    for check in CHECKS:
        check(report)
    if report.problems:
        lines = report.problems
        head = "pre-flight check failed: " if len(lines) == 1 else f"pre-flight check found {len(lines)} problems:\n  "
        raise UserError(head + "\n  ".join(lines))
    return report
