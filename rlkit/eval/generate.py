"""`rlkit generate`: N responses per prompt of a data file into a parquet, in verl's `main_generation` keys and layout.

verl's `python -m verl.trainer.main_generation data.path=... model.path=... data.n_samples=N data.output_path=...`
reads a parquet's `data.prompt_key` column (chat messages), renders each prompt with the chat template and the
generation prompt, samples `n_samples` responses per prompt, and writes the input table with a `responses` column
(a list of N strings per row). Here the same keys drive one process (no Ray), with `rlkit eval`'s rollout backends
(rlkit/eval/evaluator.py): the model may also be a training checkpoint or a PEFT adapter. verl's launcher and
worker keys (trainer.*, actor.*, ray_kwargs.*) have nothing to set in one process and are listed in one line.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rlkit.errors import UserError

log = logging.getLogger(__name__)

#: verl's generation.yaml defaults for the keys read here
DEFAULTS: dict[str, Any] = {
    "data": {"path": "~/data/rlhf/math/test.parquet", "prompt_key": "prompt", "n_samples": 5,
             "output_path": None, "batch_size": 128, "trust_remote_code": False, "apply_chat_template_kwargs": {}},
    "model": {"path": None, "external_lib": None},
    "rollout": {"name": None, "temperature": 1.0, "top_k": 50, "top_p": 0.7, "prompt_length": 1536,
                "response_length": 512, "do_sample": True, "seed": 0},
}
#: sections of verl's generation.yaml for its Ray workers: nothing to set in one process
LAUNCHER_SECTIONS = ("trainer", "actor", "ray_kwargs", "hydra")
#: verl rollout keys of GPU-engine tuning with nothing to set here (the rest are RolloutConfig's own)
ROLLOUT_INERT = ("_target_", "mode", "data_parallel_size", "log_prob_micro_batch_size",
                 "log_prob_micro_batch_size_per_gpu", "calculate_log_probs", "n")


@dataclass
class GenerateJob:
    data: dict[str, Any]
    model: dict[str, Any]
    rollout: dict[str, Any]
    notices: list[str]


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v and f"{prefix}{k}" not in ("data.apply_chat_template_kwargs",):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_job(overrides: list[str], config_file: str | None = None) -> GenerateJob:
    """verl's generation keys (`key=value`, Hydra's `+key=` and `++key=` too, over an optional YAML file) checked:
    UserError naming an unknown key with the closest ones."""
    from omegaconf import OmegaConf

    from rlkit.config.rollout import RolloutConfig

    layers = [OmegaConf.create(DEFAULTS)]
    if config_file:
        layers.append(OmegaConf.load(Path(config_file).expanduser()))
    try:
        layers.append(OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))
    except Exception as exc:  # omegaconf's grammar errors
        raise UserError(f"cannot read the overrides ({str(exc).splitlines()[0]}); write them as key=value") from None
    tree = OmegaConf.to_container(OmegaConf.merge(*layers), resolve=True)
    rollout_keys = {f.name for f in fields(RolloutConfig)} | set(ROLLOUT_INERT)
    known = set(_flat(DEFAULTS))
    ignored = set()
    for key in _flat(tree):
        section, _, rest = key.partition(".")
        if section in LAUNCHER_SECTIONS:
            ignored.add(section)
        elif key not in known and not (section == "rollout" and rest.split(".")[0] in rollout_keys):
            close = difflib.get_close_matches(key, sorted(known | {f"rollout.{k}" for k in rollout_keys}), n=3)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise UserError(f"unknown key '{key}' for rlkit generate{hint} (`rlkit generate --help` lists them)")
    notices = [f"{', '.join(f'{s}.*' for s in sorted(ignored))}: nothing to set, rlkit generate runs in one "
               "process"] if ignored else []
    if tree["model"].get("external_lib"):
        raise UserError("model.external_lib: rlkit loads transformers' own model classes; remove it")
    if not tree["model"].get("path"):
        raise UserError("model.path is not set; e.g. model.path=smollm2-135m-instruct (a folder, alias, hub id, "
                        "checkpoint or adapter)")
    if not tree["data"].get("output_path"):
        raise UserError("data.output_path is not set; e.g. data.output_path=~/data/gen/test.parquet")
    return GenerateJob(tree["data"], tree["model"], tree["rollout"], notices)


def _rollout_config(job: GenerateJob, prompt_length: int, response_length: int, batch: int) -> Any:
    from rlkit.rollout import RolloutConfig, default_backend_name

    r = {k: v for k, v in job.rollout.items() if k not in ROLLOUT_INERT}
    r["name"] = r.get("name") or default_backend_name()
    r["top_k"] = -1 if r.get("top_k") in (0, None) else r["top_k"]  # verl: 0 (hf) or -1 (vllm) = off
    r.update(prompt_length=prompt_length, response_length=response_length,
             batch_rows=min(RolloutConfig.max_num_seqs, batch))
    if r.get("dtype") == "bf16":
        r["dtype"] = "bfloat16"
    return RolloutConfig(**r)


def _prompt_ids(tokenizer: Any, prompts: list[Any], job: GenerateJob, path: Path) -> list[list[int]]:
    """Each row's prompt (messages, or a string as one user turn) rendered with the generation prompt."""
    out = []
    kwargs = dict(job.data.get("apply_chat_template_kwargs") or {})
    for row, prompt in enumerate(prompts):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(messages, list) or not messages:
            raise UserError(f"{path} row {row}: column '{job.data['prompt_key']}' holds no chat messages; set "
                            "data.prompt_key to the column of the prompts")
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


def generate(job: GenerateJob, progress: Callable[[int, int], None] | None = None,
             notify: Callable[[str], None] = log.warning) -> Path:
    """Generate `data.n_samples` responses per prompt of `data.path`; returns the parquet written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlkit.data.collation import left_pad
    from rlkit.data.schema import data_columns, read_table
    from rlkit.eval.evaluator import fit_context, resolve_eval_model
    from rlkit.models.loading import load_tokenizer
    from rlkit.protocol import Batch
    from rlkit.reward.placement import decode_responses
    from rlkit.rollout import ROLLOUT_BACKENDS
    from rlkit.utils.fs_checks import ensure_writable_file
    from rlkit.utils.tokens import pad_token_id

    d, r = job.data, job.rollout
    n, batch_size = int(d["n_samples"]), int(d["batch_size"])
    if n < 1 or batch_size < 1:
        raise UserError(f"data.n_samples={n} and data.batch_size={batch_size} must be >= 1")
    if float(r["temperature"]) == 0 and n > 1:
        raise UserError(f"rollout.temperature=0 samples greedily: every one of data.n_samples={n} responses would be "
                        "the same; set data.n_samples=1 or a temperature > 0")
    path = Path(str(d["path"])).expanduser()
    out_path = ensure_writable_file(Path(str(d["output_path"])).expanduser(), "data.output_path")
    table = read_table(path)
    if d["prompt_key"] not in data_columns(table):
        raise UserError(f"{path}: no column '{d['prompt_key']}' (it has {', '.join(data_columns(table))}); set "
                        "data.prompt_key")
    model_path, tmp = resolve_eval_model(str(job.model["path"]))
    try:
        tokenizer = load_tokenizer(model_path)
        ids = _prompt_ids(tokenizer, table.column(d["prompt_key"]).to_pylist(), job, path)
        longest = max((len(x) for x in ids), default=1)
        prompt_len, response_len = fit_context(model_path, int(r["prompt_length"]), int(r["response_length"]),
                                               notify, longest=longest)
        cut = sum(len(x) > prompt_len for x in ids)
        if cut:
            notify(f"{cut} prompts longer than rollout.prompt_length={prompt_len} tokens keep their last tokens")
        ids = [x[-prompt_len:] for x in ids]
        cfg = _rollout_config(job, min(longest, prompt_len), response_len, batch_size * n)
        engine = ROLLOUT_BACKENDS.get(cfg.name)(model_path, cfg)
        greedy = cfg.temperature == 0 or not cfg.do_sample
        pad = pad_token_id(tokenizer)
        responses: list[list[str]] = []
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size]
            input_ids, mask, pos = left_pad(chunk, max(len(x) for x in chunk), pad)
            prompts = Batch({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos})
            sampling = cfg.to_sampling(greedy=greedy)
            sampling.seed = int(r.get("seed") or 0) + start
            out = engine.generate(prompts.repeat(n, interleave=True), sampling)
            texts = decode_responses(tokenizer, out["responses"], out["response_mask"])
            responses.extend([texts[i * n:(i + 1) * n] for i in range(len(chunk))])
            if progress is not None:
                progress(min(start + batch_size, len(ids)), len(ids))
    finally:
        if tmp is not None:
            tmp.cleanup()
    column = pa.array(responses, type=pa.list_(pa.string()))
    if "responses" in table.column_names:
        table = table.drop_columns(["responses"])
    pq.write_table(table.append_column("responses", column), out_path)
    return out_path

