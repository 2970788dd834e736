"""Model-based reward styles (`reward_model.style`): what each one adds to the reward stage.

A style is a registry entry (REWARD_MODEL_STYLES) with:

- `component`: its name in `reward_model.mix` and in the metrics (`reward/<component>/mean`);
- `worker_role`: the worker role the layout builds for it (None: it runs on the driver);
- `check(cfg)`: its config checks (UserError naming the key), run with the finalize hooks;
- `build(cfg, tokenizer, worker)`: a `Component`, called with a rollout Batch; `worker` is the
  view of its worker role (the trainer passes it; this layer never imports rlkit.workers).

Built in: `classifier` (component `rm`: the RM worker role, rlkit/workers/reward_model.py) and
`judge` (component `judge`: the generative LLM judge, rlkit/reward/llm_judge.py, on the driver).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.registry import Registry
from rlkit.reward.placement import decode_responses

if TYPE_CHECKING:
    from rlkit.config.schema import RLConfig

#: the rule scorers' component (the reward manager); every style adds one more
RULE = "rule"


@dataclass
class ComponentScores:
    """One component's score per row (B,), its metrics (besides `reward/<component>/mean`) and the
    tensors it leaves in the batch (e.g. `rm_scores`)."""

    values: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


class Component(Protocol):
    def __call__(self, batch: Batch) -> ComponentScores: ...


REWARD_MODEL_STYLES: Registry[Any] = Registry("reward model style")


def model_style(cfg: RLConfig) -> Any:
    """The configured style's entry, or None when `reward_model.enable` is off."""
    rm = cfg.reward_model
    if not rm.enable:
        return None
    if rm.style not in REWARD_MODEL_STYLES:
        raise UserError(
            f"reward_model.style='{rm.style}' is not registered; choose one of {REWARD_MODEL_STYLES.names()}"
        )
    return REWARD_MODEL_STYLES.get(rm.style)


def all_components() -> list[str]:
    """The mix components every registered style and the rule scorers could add."""
    return [RULE, *sorted({REWARD_MODEL_STYLES.get(name).component for name in REWARD_MODEL_STYLES})]


# --------------------------------------------------------------------------------------------- classifier
RM_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


@REWARD_MODEL_STYLES.register("classifier")
class ClassifierStyle:
    """A sequence-classification RM in a worker role (`compute_rm_score`), score on the last token."""

    component = "rm"
    worker_role = "reward_model"

    @staticmethod
    def check(cfg: RLConfig) -> None:
        rm = cfg.reward_model
        if not rm.model.path:
            raise UserError(
                "reward_model.enable=true with style=classifier needs reward_model.model.path: the "
                "folder, hub id or alias of an AutoModelForSequenceClassification with one label"
            )
        if rm.max_length is not None and rm.max_length < 2:
            raise UserError(f"reward_model.max_length={rm.max_length} must be >= 2 (or null)")
        if rm.model.input_tokenizer and not cfg.data.return_raw_chat:
            raise UserError("reward_model.model.input_tokenizer re-renders each prompt's chat messages with the RM's "
                            "template, so it needs data.return_raw_chat=true")

    @staticmethod
    def build(cfg: RLConfig, tokenizer: Any, worker: Any) -> Component:
        if worker is None:
            raise UserError("reward_model.style=classifier: no reward_model worker role was built")
        keys = list(RM_INPUT_KEYS) + (["raw_prompt"] if cfg.reward_model.model.input_tokenizer else [])

        def score(batch: Batch) -> ComponentScores:
            missing = [k for k in keys if k not in batch]
            if missing:
                raise UserError(f"reward model: the batch has no {missing}; keys: {batch.keys()}")
            out = worker.compute_rm_score(batch.select(keys, meta_keys=[]))
            rm_scores = out["rm_scores"]
            metrics = {k: float(sum(v) / len(v)) for k, v in out.meta.get("metrics", {}).items() if v}
            return ComponentScores(rm_scores.sum(-1), metrics, {"rm_scores": rm_scores})

        return score


# ------------------------------------------------------------------------------------------------- judge
@REWARD_MODEL_STYLES.register("judge")
class JudgeStyle:
    """A generative LLM judge on the driver (reward_model.judge); failures score 0 and are counted."""

    component = "judge"
    worker_role = None

    @staticmethod
    def check(cfg: RLConfig) -> None:
        from rlkit.reward.llm_judge import check_judge_config

        check_judge_config(cfg.reward_model.judge)
        if not cfg.data.return_raw_chat:
            raise UserError("reward_model.style=judge shows the judge each prompt's chat messages, so it needs "
                            "data.return_raw_chat=true")

    @staticmethod
    def build(cfg: RLConfig, tokenizer: Any, worker: Any) -> Component:
        from rlkit.reward.judge_text import prompt_text
        from rlkit.reward.llm_judge import LLMJudge, judge_metrics

        judge = LLMJudge(cfg.reward_model.judge)

        def score(batch: Batch) -> ComponentScores:
            for key in ("responses", "response_mask", "raw_prompt"):
                if key not in batch:
                    raise UserError(f"reward judge: the batch has no '{key}'; keys: {batch.keys()}")
            responses = decode_responses(tokenizer, batch["responses"], batch["response_mask"])
            prompts = [prompt_text(list(p) if not isinstance(p, str) else p) for p in batch["raw_prompt"]]
            rms = batch["reward_model"] if "reward_model" in batch else [None] * len(batch)
            truths = [rm.get("ground_truth") if isinstance(rm, Mapping) else None for rm in rms]
            verdicts = judge.score(prompts, responses, [None if t is None else str(t) for t in truths])
            metrics = judge_metrics(verdicts)
            return ComponentScores(torch.tensor([v.score for v in verdicts], dtype=torch.float32), metrics)

        score.close = judge.close  # type: ignore[attr-defined]
        return score
