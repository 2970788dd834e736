"""`RewardModelConfig`: the `reward_model` section: rule scorers, a model-based reward and how they mix.

verl's key names. The reward of a sample is a weighted sum of components (`mix`): `rule` (the reward
manager's scorers, chosen by data_source), and, with `enable=true`, the component of the `style`:
`rm` (classifier: a sequence-classification reward model in a frozen FSDP2 worker role) or `judge`
(a generative LLM judge, `judge`). What needs the registries (style names, mix component names, the
judge's backend/parser) is checked by rlkit.reward.model_styles through the finalize hooks.

Truncation (`max_length`): an RM input longer than `max_length` keeps its last `max_length` tokens
(left truncation): the start of the prompt goes first; the response and the token the score is read
from (the last one) always stay.

Placement: colocated by default (the RM is one more role in each trainer process, its parameters
offloaded to CPU between uses with `model.fsdp_config.param_offload=true` on GPU);
`enable_resource_pool=true` puts it on a worker group of its own (`nnodes` x `n_gpus_per_node`
processes, `cpus_per_worker` CPUs each without a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.config.fsdp import FSDPConfig
from rlkit.config.judge import JudgeConfig
from rlkit.config.profiler import RoleProfilerConfig


def f(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class RewardModelModelConfig:
    path: str | None = f(
        None,
        "classifier RM: HF folder, hub id or alias of an AutoModelForSequenceClassification "
        "with one label (its config needs pad_token_id)",
    )
    input_tokenizer: str | None = f(
        None,
        "null = the RM reads the policy's token ids as they are (same tokenizer and chat template); a "
        "folder/alias (the policy's, e.g. ${actor_rollout_ref.model.path}) = decode the policy's tokens with it, "
        "apply the RM's chat template to raw_prompt + response and re-tokenise with the RM's tokenizer",
    )
    trust_remote_code: bool = f(False, "allow custom model code from the RM folder")
    attn_implementation: str = f("sdpa", "attention kernel passed to transformers")
    fsdp_config: FSDPConfig = f(
        factory=FSDPConfig, help="FSDP2 settings of the frozen RM (param_offload: on CPU between uses, GPU only)"
    )


@dataclass
class RewardModelConfig:
    enable: bool = f(False, "add a model-based reward component (style) to the rule scores, weighted by `mix`")
    style: str = f(
        "classifier",
        "the model-based reward (rlkit.reward.model_styles.REWARD_MODEL_STYLES): "
        "classifier = an RM worker role scores each sample (component rm); judge = an LLM "
        "judge (component judge, see reward_model.judge)",
    )
    model: RewardModelModelConfig = f(factory=RewardModelModelConfig, help="the classifier RM")
    micro_batch_size_per_gpu: int = f(8, "classifier: sequences per RM forward on each worker")
    max_length: int | None = f(
        None,
        "classifier: longest RM input; a longer one keeps its last max_length tokens "
        "(left truncation: the response and the score token stay). null = no limit",
    )
    enable_resource_pool: bool = f(
        False,
        "classifier: the RM on a worker group of its own (nnodes x "
        "n_gpus_per_node) instead of in the trainer processes",
    )
    nnodes: int = f(1, "enable_resource_pool: nodes of the RM group")
    n_gpus_per_node: int = f(1, "enable_resource_pool: RM workers per node (GPUs, or CPU processes)")
    cpus_per_worker: float = f(1.0, "enable_resource_pool: CPU cores reserved per RM worker")
    judge: JudgeConfig = f(factory=JudgeConfig, help="style=judge: the generative judge")
    mix: dict = f(
        factory=dict,
        help="component -> weight of the reward, e.g. {rule: 1.0, rm: 0.5}; a component "
        "that runs and is not named weighs 1.0; rule: 0 = no rule scorer runs (pure RM). "
        "by_data_source: {<data_source>: {rule: .., rm: ..}} overrides per data_source",
    )
    reward_manager: str = f(
        "rule",
        "the rule component (rlkit.reward.REWARD_MANAGERS): rule (alias naive) = one "
        "scorer per sample by data_source; batch = custom_reward_function scores the whole batch in one call; "
        "dapo = rule + overlong penalty (reward_kwargs.overlong_buffer_cfg, max_resp_len); prime = rule on "
        "reward_kwargs.num_processes workers; coevolve = coder/tester pass matrix (docs/agents.md)",
    )
    reward_kwargs: dict = f(
        factory=dict,
        help="keyword arguments of the reward manager, e.g. for dapo {max_resp_len: 1024, overlong_buffer_cfg: "
        "{enable: true, len: 256, penalty_factor: 1.0, log: false}}; for batch they go to the function; for "
        "coevolve {tester_reward: gated, tests_per_run: 1, per_test_s: 2.0, memory_mb: 512}",
    )
    overrides: dict = f(factory=dict, help="data_source -> scorer name, overriding the built-in map")
    scorer_kwargs: dict = f(factory=dict, help="scorer name -> kwargs, e.g. {gsm8k: {method: flexible}}")
    num_workers: int = f(4, "threads scoring in parallel")
    timeout_s: float = f(10.0, "per-sample scoring timeout (the sample scores 0)")
    overlong_buffer: dict = f(
        factory=lambda: {"enable": False, "len": 64, "penalty_factor": 1.0},
        help="DAPO overlong shaping after scoring (any reward manager): linear penalty over the last `len` "
        "tokens before data.max_response_length, down to -penalty_factor; log: add reward_extra/overlong_reward",
    )
    profiler: RoleProfilerConfig = f(factory=RoleProfilerConfig, help="classifier: trace the RM role at "
                                     "global_profiler.steps")
