"""LLM-as-judge: an LLM reads (prompt, response, ground truth) through a template and its verdict becomes a score.

Why: open-ended answers (helpfulness, style, proofs) have no rule scorer; a judge model grades them.
`reward_model.judge` (rlkit.config.judge.JudgeConfig) picks the backend (rlkit.reward.judge_backends:
an OpenAI-compatible endpoint or an in-process vLLM engine), the template and the parser
(rlkit.reward.judge_text). A failed request, a timeout or a verdict without a score costs that sample 0
and a counted error; only a bad configuration raises (a UserError naming the key and the fix).

    from rlkit.config.judge import JudgeConfig
    from rlkit.reward.llm_judge import LLMJudge, judge_metrics

    cfg = JudgeConfig(backend="http", base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen2.5-7B-Instruct")
    with LLMJudge(cfg) as judge:
        verdicts = judge.score(["What is 2+2?"], ["4"], ["4"])
    verdicts[0].score, verdicts[0].error   # 1.0, None  (the judge replied "... Score: 10")
    judge_metrics(verdicts)                # {"reward/judge/mean": 1.0, "reward/judge/errors": 0, ...}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rlkit.config.judge import JudgeConfig
from rlkit.reward.judge_backends import JUDGE_BACKENDS, EngineFactory, JudgeBackend
from rlkit.reward.judge_text import JudgeTemplate, load_parser, parse_score

METRIC_PREFIX = "reward/judge"


@dataclass
class JudgeVerdict:
    """One sample's judgement: score (0.0 on error), error (None, "timeout", "http 500", "unparsable: ..."),
    the judge's raw reply and how many requests it took."""

    score: float
    error: str | None = None
    raw: str = ""
    attempts: int = 1

    @property
    def error_kind(self) -> str | None:
        """The error without its detail ("http 500", "timeout", "unparsable"), for counting."""
        return None if self.error is None else self.error.split(":", 1)[0]


def check_judge_config(cfg: JudgeConfig) -> None:
    """Everything a judge needs that the config layer cannot check (backend and parser names, the
    template's placeholders, the backend's required keys); raises UserError. Builds nothing."""
    backend = JUDGE_BACKENDS.get(cfg.backend)
    backend.check_config(cfg)
    JudgeTemplate.from_config(cfg.template, cfg.template_path)
    load_parser(cfg.parser)


class LLMJudge:
    """Scores (prompt, response, ground_truth) triples with the configured judge.

    backend: an already built backend (tests, sharing one); engine_factory: how the `vllm` backend
    builds its `vllm.LLM` from engine keyword arguments (default: `vllm.LLM(**kwargs)` in this process).
    """

    def __init__(
        self, cfg: JudgeConfig, *, backend: JudgeBackend | None = None, engine_factory: EngineFactory | None = None
    ) -> None:
        check_judge_config(cfg)
        self.cfg = cfg
        self.template = JudgeTemplate.from_config(cfg.template, cfg.template_path)
        self.parser = load_parser(cfg.parser)
        if backend is None:
            cls = JUDGE_BACKENDS.get(cfg.backend)
            backend = cls(cfg, engine_factory=engine_factory) if engine_factory is not None else cls(cfg)
        self.backend = backend

    def render(
        self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[str | None]
    ) -> list[str]:
        """The judge prompts, one per sample (what the backend sends)."""
        if not len(prompts) == len(responses) == len(ground_truths):
            raise ValueError(
                f"LLMJudge.score: {len(prompts)} prompts, {len(responses)} responses and "
                f"{len(ground_truths)} ground truths; give one of each per sample"
            )
        return [self.template.render(p, r, g) for p, r, g in zip(prompts, responses, ground_truths)]

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[str | None]
    ) -> list[JudgeVerdict]:
        """One verdict per sample, in order. Never raises for a failing judge."""
        texts = self.render(prompts, responses, ground_truths)
        if not texts:
            return []
        try:
            completions = self.backend.complete(texts)
        except Exception as exc:  # a backend bug must not end the run either: every sample scores 0, counted
            return [JudgeVerdict(0.0, f"backend: {type(exc).__name__}: {exc}") for _ in texts]
        if len(completions) != len(texts):
            error = f"backend: {len(completions)} replies for {len(texts)} prompts"
            return [JudgeVerdict(0.0, error) for _ in texts]
        verdicts = []
        for c in completions:
            if c.error is not None:
                verdicts.append(JudgeVerdict(0.0, c.error, c.text, c.attempts))
                continue
            value, error = parse_score(self.parser, c.text)
            verdicts.append(JudgeVerdict(value, error, c.text, c.attempts))
        return verdicts

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> LLMJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def judge_metrics(verdicts: Sequence[JudgeVerdict], prefix: str = METRIC_PREFIX) -> dict[str, float]:
    """`reward/judge/mean` (errors count as 0), `reward/judge/errors`, `reward/judge/retries`
    (requests beyond the first) and `reward/judge/errors/<kind>` per kind seen (spaces as '_')."""
    n = len(verdicts)
    out: dict[str, float] = {
        f"{prefix}/mean": sum(v.score for v in verdicts) / n if n else 0.0,
        f"{prefix}/errors": float(sum(v.error is not None for v in verdicts)),
        f"{prefix}/retries": float(sum(max(v.attempts - 1, 0) for v in verdicts)),
    }
    kinds = Counter(v.error_kind for v in verdicts if v.error is not None)
    for kind, count in sorted(kinds.items()):
        out[f"{prefix}/errors/{str(kind).replace(' ', '_')}"] = float(count)
    return out


def judge_texts(
    cfg: JudgeConfig,
    prompts: Sequence[str],
    responses: Sequence[str],
    ground_truths: Sequence[str | None] | None = None,
    engine_factory: EngineFactory | None = None,
) -> tuple[list[JudgeVerdict], dict[str, float]]:
    """Build a judge, score the samples, close it: what `rlkit reward score` calls with the judge options.
    ground_truths None = none for any sample."""
    if ground_truths is None:
        ground_truths = [None] * len(prompts)
    with LLMJudge(cfg, engine_factory=engine_factory) as judge:
        verdicts = judge.score(prompts, responses, ground_truths)
    return verdicts, judge_metrics(verdicts)
