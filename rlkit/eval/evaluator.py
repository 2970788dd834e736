"""Offline evaluation: sample K responses per prompt with a rollout backend, score them, aggregate.

Runs in one process (no Ray): the same rollout backends and reward manager as
training, so an eval number means the same thing as a `val/` metric. With a
`MultiTurnConfig` (the CLI's `--tools`) the engine is wrapped in the agent loop
as in training (tools between turns, an optional simulated user), and each
generation row also says how many turns and tool calls it took.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlkit.algo.sample_metrics import metrics_by_source
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.reward.placement import decode_responses

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # data_source -> metric -> value
    rows: list[dict[str, Any]] = field(default_factory=list)


def resolve_eval_model(spec: str) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """A model folder/alias/hub id, a training checkpoint (exported to a temp HF folder first), or a PEFT
    adapter folder (merged into the base model its adapter_config.json names, in a temp HF folder)."""
    path = Path(spec).expanduser()
    from rlkit.models.lora import is_adapter_folder

    if is_adapter_folder(path):
        return merged_adapter_folder(path)
    if path.is_dir() and (path / "actor").is_dir():
        from rlkit.utils.checkpoint_io import open_checkpoint
        from rlkit.workers.fsdp_model import export_hf

        path = open_checkpoint(path, "rlkit eval")  # names a missing shard instead of a DCP traceback
        tmp = tempfile.TemporaryDirectory(prefix="rlkit-eval-")
        export_hf(path / "actor", Path(tmp.name), tokenizer_dir=path / "actor" / "tokenizer")
        return tmp.name, tmp
    from rlkit.models.resolve import resolve_model_path

    return str(resolve_model_path(spec)), None


def merged_adapter_folder(adapter: Path) -> tuple[str, tempfile.TemporaryDirectory]:
    """Base + adapter merged into a temp HF folder (both backends load it; vLLM needs no LoRA support).
    The tokenizer is the adapter folder's if it has one (`rlkit export --adapter-only` writes it), else the base's."""
    from peft import PeftConfig
    from transformers import AutoTokenizer

    from rlkit.models.lora import load_merged_from_adapter
    from rlkit.models.resolve import resolve_model_path

    base_spec = PeftConfig.from_pretrained(str(adapter)).base_model_name_or_path
    if not base_spec:
        raise UserError(f"{adapter}: adapter_config.json names no base_model_name_or_path; set it to the base model")
    base = resolve_model_path(base_spec)
    tmp = tempfile.TemporaryDirectory(prefix="rlkit-eval-")
    load_merged_from_adapter(adapter, base).save_pretrained(tmp.name)
    has_tokenizer = (adapter / "tokenizer_config.json").is_file()
    AutoTokenizer.from_pretrained(str(adapter if has_tokenizer else base)).save_pretrained(tmp.name)
    for name in ("generation_config.json",):  # stop ids
        if (Path(base) / name).is_file() and not (Path(tmp.name) / name).is_file():
            (Path(tmp.name) / name).write_bytes((Path(base) / name).read_bytes())
    return tmp.name, tmp


def aggregate(rows: list[dict[str, Any]], k: int) -> dict[str, dict[str, float]]:
    """Per data_source: the prompt count and the metrics validation logs (rlkit.algo.sample_metrics:
    score/mean@k, acc/mean@k, and for k > 1 score/best@k, acc/pass@k, acc/maj@k), response lengths."""
    out = metrics_by_source(
        [r["data_source"] for r in rows], [r["prompt_index"] for r in rows], [r["score"] for r in rows], k,
        acc=[r["extras"].get("acc") for r in rows], preds=[r["extras"].get("pred") for r in rows],
        lengths=[r["response_length"] for r in rows],
    )
    for ds, metrics in out.items():
        mine = [r for r in rows if r["data_source"] == ds]
        metrics["prompts"] = float(len({r["prompt_index"] for r in mine}))
        for key in ("num_turns", "tool_calls"):  # multi-turn eval
            if mine and key in mine[0]:
                metrics[f"{key}/mean"] = float(np.mean([r[key] for r in mine]))
    return out


def evaluate(
    model: str,
    data: str,
    n: int = 1,
    limit: int | None = None,
    backend: str | None = None,
    temperature: float | None = None,
    max_prompt_length: int = 512,
    max_response_length: int = 512,
    batch_size: int = 64,
    progress: Any = None,
    notify: Callable[[str], None] | None = None,
    multi_turn: Any = None,
) -> EvalResult:
    """`multi_turn`: a rlkit.config.agent.MultiTurnConfig with enable=true runs the agent loop (tools between turns)."""
    from rlkit.data import RLDataset
    from rlkit.models.loading import load_tokenizer
    from rlkit.reward.manager import RewardManager
    from rlkit.rollout import ROLLOUT_BACKENDS, RolloutConfig, default_backend_name

    if n < 1:
        raise UserError(f"--n must be >= 1, got {n}")
    model_path, tmp = resolve_eval_model(model)
    try:
        tokenizer = load_tokenizer(model_path)
        dataset = RLDataset(data, tokenizer, max_prompt_length, truncation="left", max_samples=limit)
        lengths = dataset.prompt_lengths
        agent = multi_turn is not None and multi_turn.enable  # prompts are re-rendered longer, with the tool schemas
        max_prompt_length, max_response_length = fit_context(
            model_path, max_prompt_length, max_response_length, notify or log.warning,
            longest=int(lengths.max()) if len(lengths) and not agent else None,
        )
        dataset.max_prompt_length = max_prompt_length  # pad to what the prompts need, not more
        temp = temperature if temperature is not None else (0.0 if n == 1 else 1.0)
        cfg = RolloutConfig(
            name=backend or default_backend_name(), prompt_length=max_prompt_length,
            response_length=max_response_length, temperature=temp, do_sample=temp > 0,
            batch_rows=min(RolloutConfig.max_num_seqs, batch_size * n),
        )
        engine = ROLLOUT_BACKENDS.get(cfg.name)(model_path, cfg)
        agent_keys: Callable[[Batch], list[str]] = lambda batch: []  # noqa: E731
        if agent:
            from rlkit.rollout.agent_rollout import AgentRollout, agent_input_keys

            cfg.multi_turn = multi_turn
            engine, agent_keys = AgentRollout(engine, tokenizer, cfg), agent_input_keys
        reward = RewardManager(tokenizer)
        rows: list[dict[str, Any]] = []
        total = len(dataset)
        for start in range(0, total, batch_size):
            idx = np.arange(start, min(start + batch_size, total))
            prompts = dataset.get_batch(idx).repeat(n, interleave=True)
            prompts["prompt_index"] = np.repeat(idx, n)
            sampling = cfg.to_sampling(greedy=temp == 0)
            sampling.seed = start
            keys = ["input_ids", "attention_mask", "position_ids", *agent_keys(prompts)]
            out = engine.generate(prompts.select(keys), sampling)
            out.non_tensors.update(prompts.non_tensors)
            scored = reward(out)
            rows.extend(_rows(out, scored, tokenizer))
            if progress is not None:
                progress(min(start + batch_size, total), total)
        return EvalResult(aggregate(rows, n), rows)
    finally:
        if tmp is not None:
            tmp.cleanup()


def fit_context(model_path: str, prompt_len: int, response_len: int, notify: Callable[[str], None],
                longest: int | None = None) -> tuple[int, int]:
    """(prompt, response) lengths that fit the model's context (vLLM refuses an engine that does not fit).

    `longest` is the longest prompt of the data: the prompt length shrinks to it first, then the response
    is capped (and `notify` says so); a UserError names the option to lower when prompts fill the context.
    """
    from rlkit.models.context import context_length

    limit = context_length(model_path)
    if limit is None or prompt_len + response_len <= limit:
        return prompt_len, response_len
    need = min(prompt_len, longest) if longest else prompt_len
    if need + response_len <= limit:
        return need, response_len
    where = f"max_position_embeddings in {model_path}/config.json"
    if need >= limit:
        raise UserError(f"prompts take up to {need} tokens (--max-prompt-length {prompt_len}) and leave no room for a "
                        f"response: the model holds {limit} tokens ({where}); lower --max-prompt-length (longer "
                        f"prompts are cut on the left), e.g. --max-prompt-length {limit // 2}")
    capped = limit - need
    notify(f"--max-response-length {response_len} capped to {capped}: the model holds {limit} tokens ({where}) "
           f"and prompts take up to {need}")
    return need, capped


def _rows(out: Batch, scored: Batch, tokenizer: Any) -> list[dict[str, Any]]:
    scores = scored["token_level_scores"].sum(-1).tolist()
    lengths = out["response_mask"].sum(-1).tolist()
    texts = decode_responses(tokenizer, out["responses"], out["response_mask"])  # the text the scorer saw
    extra_keys = [k for k in scored.non_tensors if k.startswith("reward_extra/")]
    rows = []
    for i in range(len(out)):
        extras = {k.split("/", 1)[1]: _plain(scored[k][i]) for k in extra_keys if scored[k][i] is not None}
        rm = out["reward_model"][i]
        rows.append({
            "prompt_index": int(out["prompt_index"][i]),
            "data_source": str(out["data_source"][i]),
            "prompt": out["raw_prompt"][i] if "raw_prompt" in out else None,
            "response": texts[i],
            "ground_truth": rm.get("ground_truth") if isinstance(rm, dict) else None,
            "score": float(scores[i]),
            "extras": extras,
            "response_length": int(lengths[i]),
        })
        for key in AGENT_ROW_KEYS:  # the agent loop's per-episode facts (multi-turn eval)
            if f"agent/{key}" in out.non_tensors:
                rows[-1][key] = _plain(out[f"agent/{key}"][i])
    return rows


AGENT_ROW_KEYS = ("num_turns", "tool_calls", "tool_errors", "finish", "interaction_reward")


def _plain(v: Any) -> Any:
    if isinstance(v, (np.generic,)):
        return v.item()
    return v


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")
