"""The `distillation` section: on-policy distillation from one or several teachers (verl's key names).

The student samples, each teacher scores every sampled token, and the student is trained on a per-token
loss against the teacher's log-probs (docs/distillation.md). `teacher_models` is a mapping name -> teacher;
`teacher` reads one entry as a `TeacherModelConfig`, naming the bad key of a wrong one. A teacher is a frozen
FSDP2 model of the trainer processes (colocated, `nnodes: 0`), of a worker group of its own (`nnodes` >= 1),
or an OpenAI-compatible endpoint (`base_url`) that returns prompt log-probs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlkit.errors import UserError

PREFIX = "distillation."


def f(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class DistillationLossConfig:
    loss_mode: str = f("k3", "per-token loss against the teacher (rlkit.algo.DISTILL_LOSSES): k1 | k3/low_var_kl | "
                       "abs | mse/k2 (reverse-KL estimators on the sampled token) | forward_kl_topk (the "
                       "teacher's top-k distribution)")
    topk: int = f(32, "forward_kl_topk: how many of the teacher's most likely tokens per position")
    use_task_rewards: bool = f(True, "keep the task reward's policy-gradient loss beside the distillation term; "
                               "false = distillation alone (the reward is still scored and logged)")
    distillation_loss_coef: float = f(1.0, "weight of the distillation term (direct loss, or its per-token "
                                      "advantage under use_policy_gradient)")
    loss_max_clamp: float | None = f(None, "clamp each token's distillation loss to at most this; null = none")
    log_prob_min_clamp: float | None = f(None, "clamp student and teacher log-probs to at least this before the "
                                         "loss (tokens one model finds near-impossible); null = none")
    use_policy_gradient: bool = f(False, "the distillation loss as a per-token reward: advantage = -coef * loss "
                                  "(no gradient through it) under policy_loss_mode, instead of a direct loss")
    policy_loss_mode: str = f("vanilla", "use_policy_gradient: the policy loss (rlkit.algo.POLICY_LOSSES)")
    clip_ratio: float = f(0.2, "use_policy_gradient: PPO clip ratio (both sides unless low/high are set)")
    clip_ratio_low: float | None = f(0.2, "use_policy_gradient: lower clip ratio; null = clip_ratio")
    clip_ratio_high: float | None = f(0.2, "use_policy_gradient: upper clip ratio; null = clip_ratio")


@dataclass
class TeacherModelConfig:
    """One entry of `distillation.teacher_models`."""

    key: str | None = f(None, "the rows whose teacher_key column has this value go to this teacher; null = all "
                        "rows (one teacher)")
    model_path: str | None = f(None, "local teacher: HF folder, .gguf, alias or hub id; served teacher: the model "
                               "name the endpoint serves")
    num_replicas: int = f(0, "verl's inference replicas: 0 (rlkit's local teacher is an FSDP2 forward)")
    inference: dict = f(factory=dict, help="verl's teacher inference engine settings: none apply to rlkit's "
                        "FSDP2 teacher (a notice names them)")
    tokenizer_path: str | None = f(None, "the teacher's tokenizer when it is not its model folder's (served: null "
                                   "= the student's)")
    trust_remote_code: bool = f(False, "allow custom model code from the teacher folder")
    base_url: str = f("", "served teacher: an OpenAI-compatible endpoint returning prompt log-probs (vLLM's "
                      "server), e.g. http://127.0.0.1:8000/v1; empty = a local FSDP2 teacher")
    api_key_env: str = f("OPENAI_API_KEY", "served: environment variable holding the API key (may be unset)")
    concurrency: int = f(8, "served: requests in flight at once")
    timeout_s: float = f(60.0, "served: limit of one request attempt, seconds")
    retries: int = f(2, "served: retries after a timeout, connection error, 5xx, 408 or 429")
    retry_backoff_s: float = f(0.5, "served: first retry delay, doubled each retry")

    @property
    def served(self) -> bool:
        return bool(self.base_url)


@dataclass
class DistillationConfig:
    enabled: bool = f(False, "train the policy against teacher log-probs on its own samples (docs/distillation.md)")
    distillation_loss: DistillationLossConfig = f(factory=DistillationLossConfig, help="the distillation loss")
    n_gpus_per_node: int = f(8, "nnodes >= 1: teacher workers per node (GPUs, or CPU processes)")
    nnodes: int = f(0, "0 = local teachers live in the trainer processes (as the reference); >= 1 = a worker "
                    "group of their own, nnodes x n_gpus_per_node")
    teacher_models: dict = f(factory=dict, help="name -> teacher (key, model_path, or base_url for a served one); "
                             "see docs/distillation.md")
    teacher_key: str = f("data_source", "the batch column whose value selects a row's teacher (each teacher's key)")


def teacher(name: str, entry: Any) -> TeacherModelConfig:
    """`teacher_models.<name>` as a TeacherModelConfig; UserError naming the key of a bad entry."""
    where = f"{PREFIX}teacher_models.{name}"
    if not isinstance(entry, dict):
        raise UserError(f"{where} must be a mapping with model_path (and key), got {entry!r}")
    known = {fld.name for fld in dataclasses.fields(TeacherModelConfig)}
    values = {k: v for k, v in entry.items() if k != "_target_"}  # verl's dataclass target: nothing to read
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"{where}.{unknown[0]} is not a teacher key; the keys are {', '.join(sorted(known))}")
    cfg = TeacherModelConfig(**values)
    if not cfg.model_path:
        raise UserError(f"{where}.model_path is empty: name the teacher model (folder, alias or hub id; served: "
                        "the model the endpoint serves)")
    if cfg.num_replicas not in (0, None):
        raise UserError(f"{where}.num_replicas={cfg.num_replicas}: rlkit's teacher is an FSDP2 forward, not "
                        f"inference replicas; set it to 0 (or serve it and set {where}.base_url)")
    if cfg.served and not cfg.base_url.startswith(("http://", "https://")):
        raise UserError(f"{where}.base_url='{cfg.base_url}' must start with http:// or https://")
    return cfg


def teachers(d: DistillationConfig) -> dict[str, TeacherModelConfig]:
    """Every teacher of the section, by name (verl's `_target_` entries skipped)."""
    return {name: teacher(name, entry) for name, entry in d.teacher_models.items() if name != "_target_"}


def check_distillation(d: DistillationConfig, sp_size: int) -> None:
    """The section's values that no teacher could use; clip-ratio nulls become clip_ratio. `sp_size`: the actor's
    sequence parallelism (the top-k student forward is a padded one, without it)."""
    loss = d.distillation_loss
    if loss.clip_ratio_low is None:
        loss.clip_ratio_low = loss.clip_ratio
    if loss.clip_ratio_high is None:
        loss.clip_ratio_high = loss.clip_ratio
    if not d.enabled:
        return
    found = teachers(d)
    if not found:
        raise UserError(f"{PREFIX}enabled=true but {PREFIX}teacher_models is empty: add one, e.g. "
                        f"+{PREFIX}teacher_models.teacher.model_path=PATH")
    keys = [t.key for t in found.values()]
    if len(found) > 1 and (None in keys or len(set(keys)) < len(keys)):
        raise UserError(f"{PREFIX}teacher_models: with several teachers each needs its own `key` (a value of the "
                        f"{PREFIX}teacher_key column, {d.teacher_key}); got {dict(zip(found, keys))}")
    if loss.topk < 1:
        raise UserError(f"{PREFIX}distillation_loss.topk={loss.topk} must be >= 1")
    if d.nnodes < 0 or (d.nnodes > 0 and d.n_gpus_per_node < 1):
        raise UserError(f"{PREFIX}nnodes={d.nnodes} / n_gpus_per_node={d.n_gpus_per_node}: nnodes 0 = colocated, "
                        ">= 1 = a teacher group of nnodes x n_gpus_per_node (>= 1) workers")
    if loss.loss_mode == "forward_kl_topk":
        served = [n for n, t in found.items() if t.served]
        if served:
            raise UserError(f"{PREFIX}distillation_loss.loss_mode=forward_kl_topk needs a local teacher; "
                            f"{PREFIX}teacher_models.{served[0]} is served: use a reverse-KL loss_mode (k1, k3, ...)")
        if sp_size > 1:
            raise UserError(f"{PREFIX}distillation_loss.loss_mode=forward_kl_topk reads the student's full logits "
                            "without sequence parallelism: set actor_rollout_ref.actor.ulysses_sequence_parallel_size"
                            "=1 or use a reverse-KL loss_mode")
