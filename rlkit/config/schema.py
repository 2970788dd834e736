"""The typed config schema. Key names follow the field's convention (verl-style) so
existing run scripts need little change: `data.train_batch_size`,
`actor_rollout_ref.rollout.n`, `algorithm.adv_estimator`, `trainer.total_epochs`...

Every field has a default and a one-line meaning (the `help` metadata), from
which `docs/config.md` is generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlkit.config.checkpoint_contents import CheckpointContents
from rlkit.config.data_classes import DatasetClassConfig, SamplerClassConfig
from rlkit.config.distillation import DistillationConfig
from rlkit.config.fsdp import FSDPConfig
from rlkit.config.optim import OptimConfig
from rlkit.config.profiler import GlobalProfilerConfig, RoleProfilerConfig
from rlkit.config.ray_kwargs import RayKwargsConfig
from rlkit.config.reward_model import RewardModelConfig
from rlkit.config.rollout import RolloutConfig
from rlkit.errors import UserError


def f(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002 - "help" reads best in the schema
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class DataConfig:
    train_files: Any = f("~/data/gsm8k/train.parquet", "parquet file or list of files to train on")
    val_files: Any = f(None, "parquet file(s) for validation; null = no validation")
    prompt_key: str = f("prompt", "column holding the chat messages")
    image_key: str = f("images", "column holding each row's images (a list of {bytes} or {path}; one <image> per "
                       "image in the prompt), read with the model's image processor (docs/vlm.md)")
    mm_processor_kwargs: dict = f(factory=dict, help="settings for the model's image processor over its folder's, "
                                  "e.g. {min_pixels: 3136, max_pixels: 1003520} (the image resizing limits)")
    max_prompt_length: int = f(512, "prompts are left-padded to this many tokens")
    max_response_length: int = f(512, "max new tokens per response (sets rollout.response_length)")
    train_batch_size: int = f(64, "prompts per training step (before the n samples per prompt)")
    val_batch_size: int | None = f(None, "prompts per validation call; null = ~10 calls of >= 64 (progress bar)")
    gen_batch_size: int | None = f(None, "prompts per generation batch when algorithm.filter_groups (DAPO dynamic "
                                   "sampling) refills a step's train_batch_size prompts; null = train_batch_size")
    train_max_samples: int | None = f(-1, "use only the first N training rows (before any filter); -1 or null = all")
    val_max_samples: int | None = f(None, "use only the first N validation rows (a fixed subset); -1 or null = all")
    filter_overlong_prompts: bool = f(False, "drop rows whose chat-templated prompt is longer than max_prompt_length "
                                      "at load time, logging each file's kept/dropped counts; then `truncation` "
                                      "sees no over-long prompt")
    truncation: str = f("error", "what to do with over-long prompts: error | left | right | middle (keep the head "
                        "and the tail) | filter (drop them) (rlkit.data.TRUNCATION)")
    return_raw_chat: bool = f(True, "carry each row's chat messages (un-tokenized) in the batch as `raw_prompt` "
                              "(multi-turn rollouts, the judge and a reward model with its own tokenizer read it)")
    apply_chat_template_kwargs: dict = f(help="extra keywords of the chat template wherever a prompt is rendered: the "
                                         "dataset, validation and the agent loop (e.g. {enable_thinking: false})",
                                         factory=dict)
    reward_fn_key: str = f("data_source", "column whose value selects the reward scorer (passed to scorers and "
                           "custom functions as data_source)")
    shuffle: bool = f(True, "shuffle the training set each epoch (seeded, resumable)")
    validation_shuffle: bool = f(False, "visit the validation rows in a seeded random order (a new one each "
                                 "validation) instead of file order")
    seed: int | None = f(None, "data order seed; null = 1 (independent of trainer.seed)")
    sampler: SamplerClassConfig = f(factory=SamplerClassConfig, help="a user's sampler class for the training "
                                    "order (verl's data.sampler)")
    custom_cls: DatasetClassConfig = f(factory=DatasetClassConfig, help="a user's dataset class (verl's "
                                       "data.custom_cls)")


def check_compile_setting(value: Any, key: str) -> None:
    """`use_torch_compile` takes true, false or auto (rlkit/workers/layer_compile.py); anything else names the key."""
    if value not in (True, False, "auto"):
        raise UserError(f"{key}={value!r}: expected true, false or auto")


@dataclass
class ModelConfig:
    path: str = f("smollm2-135m-instruct", "HF folder, hub id, .gguf file or alias (see `rlkit model list`)")
    enable_gradient_checkpointing: bool = f(False, "recompute activations in backward to save memory")
    use_remove_padding: bool = f(True, "pack the valid tokens of a micro-batch into one row, each sequence attending "
                                 "only to itself (varlen attention, no T x T mask); off: padded rows, shared left "
                                 "padding trimmed (measured slower on CPU, docs/long_context.md)")
    response_logits_only: bool = f(True, "LM head only where response tokens are predicted (no prompt/pad logits)")
    fused_lm_head: bool = f(False, "log-probs/entropy straight from the hidden states, the LM head run in chunks of "
                            "logits_chunk_size rows and recomputed in backward, so no (tokens x vocab) logits are "
                            "kept for backward (needs response_logits_only; docs/performance.md)")
    use_torch_compile: Any = f("auto", "torch.compile (inductor) each decoder layer of the actor and reference, "
                               "dynamic shapes, compiled code cached across runs: true | false | auto (on for "
                               "models of >= 50M parameters, where it measured 4-11% off a 16-step run; a tiny "
                               "model only pays the compile time; docs/performance.md)")
    trust_remote_code: bool = f(False, "allow custom model code from the model folder")
    attn_implementation: str = f("sdpa", "attention kernel passed to transformers")
    lora_rank: int = f(0, "LoRA rank (peft); 0 = full fine-tuning. With LoRA the base is frozen, the optimizer "
                       "holds only the adapter and the reference is the base with the adapter off (docs/lora.md)")
    lora_alpha: float = f(16, "LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)")
    target_modules: Any = f("all-linear", "modules that get an adapter: all-linear (every linear layer but the "
                            "LM head) or a list of module names, e.g. [q_proj, v_proj]")
    exclude_modules: Any = f(None, "module names (list) or a regex that get no adapter; null = none")
    lora_adapter_path: str | None = f(None, "start from this PEFT adapter folder (its rank/alpha/targets win)")
    custom_chat_template: str | None = f(None, "a Jinja chat template that replaces the tokenizer's for every "
                                         "prompt of the run (dataset, agent loop, validation, exports); null = the "
                                         "tokenizer's own")
    override_config: dict = f(factory=dict, help="values set on the HF model config before the weights load, in "
                              "the trainer and the vLLM engine (hf_overrides), e.g. {max_position_embeddings: 8192, "
                              "attention_dropout: 0.0}; a name the config lacks is an error")
    lora: dict = f(factory=dict, help="verl's newer LoRA section (rank, alpha, target_modules in HF or Megatron "
                   "names, exclude_modules, adapter_path): read onto the keys above (rlkit.config.lora_section)")

    def __post_init__(self) -> None:
        check_compile_setting(self.use_torch_compile, "actor_rollout_ref.model.use_torch_compile")


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = f(16, "prompts per optimizer step (multiplied by rollout.n)")
    ppo_micro_batch_size: int | None = f(None, "deprecated global ppo_micro_batch_size_per_gpu: rows per "
                                         "forward/backward over all workers, divided by their count; null = unset")
    ppo_micro_batch_size_per_gpu: int | None = f(None, "sequences per forward/backward on each worker; null = "
                                                 "ppo_micro_batch_size / workers when set, else 4")
    use_dynamic_bsz: bool = f(False, "micro-batches bounded by a token budget instead of a count (the log-prob "
                              "passes and the critic follow unless they set their own)")
    ppo_max_token_len_per_gpu: int = f(16384, "token budget per micro-batch when use_dynamic_bsz")
    ppo_epochs: int = f(1, "passes over each rollout batch")
    shuffle: bool = f(False, "shuffle mini-batches across epochs")
    policy_loss: str = f("vanilla", "policy loss (rlkit.algo.POLICY_LOSSES)")
    clip_ratio: float = f(0.2, "PPO clip (used when clip_ratio_low/high are null)")
    clip_ratio_low: float | None = f(None, "lower clip; null = clip_ratio")
    clip_ratio_high: float | None = f(None, "upper clip (clip-higher); null = clip_ratio")
    clip_ratio_c: float = f(3.0, "dual-clip constant for negative advantages; dppo_tv/dppo_kl: the truncation of "
                            "their importance weight")
    tau_pos: float = f(1.0, "sapo: temperature of the soft gate where the advantage is positive")
    tau_neg: float = f(1.05, "sapo: temperature of the soft gate where the advantage is not positive")
    clip_cov_ratio: float = f(0.0002, "clip_cov: share of valid tokens whose gradient is dropped (verl: "
                              "policy_loss.clip_cov_ratio)")
    clip_cov_lb: float = f(1.0, "clip_cov: only tokens with covariance above this are drawn (verl: "
                           "policy_loss.clip_cov_lb)")
    clip_cov_ub: float = f(5.0, "clip_cov: only tokens with covariance below this are drawn (verl: "
                           "policy_loss.clip_cov_ub)")
    kl_cov_ratio: float = f(0.0002, "kl_cov: share of valid tokens (largest covariance) given the |log r| penalty "
                            "(verl: policy_loss.kl_cov_ratio)")
    ppo_kl_coef: float = f(0.1, "kl_cov: weight of that penalty (verl: policy_loss.ppo_kl_coef)")
    dro_beta: float | None = f(None, "dro: weight of the quadratic pull toward the old policy; required by dro "
                               "(verl: policy_loss.dro_beta)")
    vespo_k_pos: float = f(2.0, "vespo: shape k of the gamma kernel where the advantage is >= 0 (TRL's name)")
    vespo_lambda_pos: float = f(3.0, "vespo: rate lambda of the gamma kernel where the advantage is >= 0 (TRL's name)")
    vespo_k_neg: float = f(3.0, "vespo: shape k of the gamma kernel where the advantage is < 0 (TRL's name)")
    vespo_lambda_neg: float = f(2.0, "vespo: rate lambda of the gamma kernel where the advantage is < 0 (TRL's name)")
    loss_agg_mode: str = f("token-mean", "how per-token losses become one loss (rlkit.algo.LOSS_AGG)")
    entropy_coeff: float = f(0.0, "entropy bonus weight")
    use_kl_loss: bool = f(False, "add KL(actor || ref) as a loss term (needs the reference model)")
    kl_loss_coef: float = f(0.001, "weight of the KL loss")
    kl_loss_type: str = f("low_var_kl", "KL estimator of the KL loss (rlkit.algo.KL_ESTIMATORS)")
    grad_clip: float = f(1.0, "max grad norm")
    ulysses_sequence_parallel_size: int = f(1, "Ulysses sequence parallelism: groups of this many workers split each "
                                           "packed micro-batch along the sequence (docs/long_context.md); 1 = off")
    logits_chunk_size: int = f(1024, "rows of logits turned into log-probs at a time (bounds memory)")
    recompute_old_log_prob: bool = f(False, "always recompute old log-probs; off = reuse when on-policy (ppo_epochs=1)")
    router_aux_loss_coef: float | None = f(None, "MoE: weight of the router load-balancing loss added to the policy "
                                           "loss (logged as actor/router_aux_loss); null = the model config's "
                                           "router_aux_loss_coef; 0 = log it only")
    router_replay: bool = f(False, "MoE: the trainer's forward uses the experts the rollout engine chose for each "
                            "token (routing replay; the engine returns routed_experts, docs/moe.md)")
    router_replay_from: str = f("rollout", "with router_replay: whose routes the trainer replays: rollout (the "
                                "engine's, verl's R3) or old_log_prob (the actor's own in the old-log-prob pass, "
                                "replayed in the update: verl's R2)")
    freeze_vision_tower: bool = f(False, "vision-language model: the image encoder is not trained (docs/vlm.md)")
    optim: OptimConfig = f(factory=OptimConfig, help="optimizer")
    fsdp_config: FSDPConfig = f(factory=FSDPConfig, help="FSDP2 settings")
    profiler: RoleProfilerConfig = f(factory=RoleProfilerConfig, help="trace this role at global_profiler.steps")
    checkpoint: CheckpointContents = f(factory=CheckpointContents, help="what this role's checkpoints hold and a "
                                       "resume loads (verl's checkpoint.save_contents / load_contents)")


@dataclass
class RefConfig:
    log_prob_micro_batch_size: int | None = f(None, "deprecated global log_prob_micro_batch_size_per_gpu: rows over "
                                              "all workers, divided by their count; null = unset")
    log_prob_micro_batch_size_per_gpu: int | None = f(None, "sequences per reference forward; null = "
                                                      "log_prob_micro_batch_size / workers when set, else 8")
    log_prob_use_dynamic_bsz: bool | None = f(None, "reference forwards by a token budget; null = "
                                              "actor.use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = f(None, "token budget of a reference forward; null = "
                                                   "actor.ppo_max_token_len_per_gpu")
    ulysses_sequence_parallel_size: int = f(1, "sequence parallelism of the reference forward (as the actor's)")
    fsdp_config: FSDPConfig = f(factory=FSDPConfig, help="FSDP2 settings of the frozen reference")
    profiler: RoleProfilerConfig = f(factory=RoleProfilerConfig, help="trace this role at global_profiler.steps")


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = f(factory=ModelConfig, help="the policy model")
    actor: ActorConfig = f(factory=ActorConfig, help="policy training")
    ref: RefConfig = f(factory=RefConfig, help="reference policy (only built when a KL is used)")
    rollout: RolloutConfig = f(factory=RolloutConfig, help="generation engine")


@dataclass
class CriticModelConfig:
    path: str | None = f(None, "critic backbone; null = the actor's model")
    enable_gradient_checkpointing: bool = f(False, "recompute activations in backward")


@dataclass
class CriticConfig:
    enable: bool | None = f(None, "null = on when an algorithm entry declares it needs values (gae)")
    model: CriticModelConfig = f(factory=CriticModelConfig, help="critic model")
    optim: OptimConfig = f(factory=lambda: OptimConfig(lr=1e-5), help="critic optimizer")
    ppo_mini_batch_size: int | None = f(None, "null = the actor's")
    ppo_micro_batch_size: int | None = f(None, "deprecated global ppo_micro_batch_size_per_gpu: rows over all "
                                         "workers, divided by their count; null = unset")
    ppo_micro_batch_size_per_gpu: int | None = f(None, "sequences per forward/backward; null = ppo_micro_batch_size "
                                                 "/ workers when set, else 4")
    use_dynamic_bsz: bool | None = f(None, "micro-batches by a token budget; null = actor.use_dynamic_bsz")
    ppo_max_token_len_per_gpu: int = f(32768, "token budget per update micro-batch when use_dynamic_bsz")
    forward_micro_batch_size: int | None = f(None, "deprecated global forward_micro_batch_size_per_gpu; null = "
                                             "ppo_micro_batch_size")
    forward_micro_batch_size_per_gpu: int | None = f(None, "sequences per value forward (compute_values); null = "
                                                     "forward_micro_batch_size / workers when set, else "
                                                     "ppo_micro_batch_size_per_gpu")
    forward_max_token_len_per_gpu: int | None = f(None, "token budget per value forward when use_dynamic_bsz; null = "
                                                  "ppo_max_token_len_per_gpu")
    ppo_epochs: int | None = f(None, "null = the actor's")
    ulysses_sequence_parallel_size: int = f(1, "sequence parallelism of the critic (as the actor's)")
    cliprange_value: float = f(0.5, "value clipping range")
    loss_agg_mode: str = f("token-mean", "aggregation of the value loss")
    grad_clip: float = f(1.0, "max grad norm")
    fsdp_config: FSDPConfig = f(factory=FSDPConfig, help="FSDP2 settings")
    profiler: RoleProfilerConfig = f(factory=RoleProfilerConfig, help="trace this role at global_profiler.steps")
    checkpoint: CheckpointContents = f(factory=CheckpointContents, help="what this role's checkpoints hold and a "
                                       "resume loads (verl's checkpoint.save_contents / load_contents)")


@dataclass
class CustomRewardConfig:
    path: str | None = f(None, "python file with your scoring function")
    name: str = f("compute_score", "function name in that file")


@dataclass
class KLCtrlConfig:
    type: str = f("fixed", "KL coefficient controller (rlkit.algo.KL_CONTROLLERS)")
    kl_coef: float = f(0.001, "initial/fixed coefficient")
    horizon: int = f(10000, "adaptive controller horizon")
    target_kl: float = f(0.1, "adaptive controller target")


@dataclass
class FilterGroupsConfig:
    enable: bool = f(False, "DAPO dynamic sampling: drop groups whose scores are all equal, refill")
    max_num_gen_batches: int = f(10, "give up refilling after this many generation batches")


@dataclass
class PFPPOConfig:
    reweight_method: str = f("pow", "how a row's summed score becomes its sampling weight "
                             "(rlkit.algo.pf_ppo.REWEIGHTS)")
    weight_pow: float = f(2.0, "pow: the weight is |score| ** weight_pow")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = f("grpo", "advantage estimator (rlkit.algo.ADV_ESTIMATORS); the critic, n >= 2 or "
                           "greedy baseline it declares are provided")
    gamma: float = f(1.0, "discount")
    lam: float = f(1.0, "GAE lambda")
    norm_adv_by_std_in_grpo: bool = f(True, "false = Dr.GRPO")
    use_kl_in_reward: bool = f(False, "fold KL(actor || ref) into the token rewards")
    kl_penalty: str = f("kl", "KL estimator of the in-reward KL (rlkit.algo.KL_ESTIMATORS)")
    kl_ctrl: KLCtrlConfig = f(factory=KLCtrlConfig, help="in-reward KL coefficient controller")
    rollout_is: Any = f(False, "importance sampling between rollout engine and trainer, weight min(pi_old / "
                        "pi_rollout, rollout_is_threshold) at a level: token | sequence | geometric (true = token, "
                        "false/null = off; needs rollout.calculate_log_probs; docs/algorithms.md)")
    rollout_is_threshold: float = f(2.0, "upper bound (truncation) of the importance weight")
    rollout_rs: Any = f(None, "rejection: tokens/rows whose pi_old / pi_rollout at this level (token | sequence "
                               "| geometric) is outside the bounds get weight 0, or verl's modes as a comma list "
                               "(token_k1, seq_mean_k3, seq_max_k2, ...; rlkit/algo/rejection_modes.py); null = off")
    rollout_rs_threshold: Any = f(None, "upper rejection bound; null = rollout_is_threshold. With verl's modes: one "
                                  "bound per mode, comma separated ('lower_upper' ratios for *_k1)")
    rollout_rs_threshold_lower: float | None = f(None, "lower rejection bound; null = 1 / upper")
    rollout_is_batch_normalize: bool = f(False, "divide the truncated importance weights by their mean over the "
                                         "batch (tokens at level token, rows otherwise), so they average 1")
    use_pf_ppo: bool = f(False, "PF-PPO: after GAE, resample the batch with replacement, rows weighted by their score "
                         "(algorithm.pf_ppo; verl applies it with adv_estimator=gae only)")
    pf_ppo: PFPPOConfig = f(factory=PFPPOConfig, help="PF-PPO's row weights")
    bypass_mode: bool = f(False, "old log-probs are the rollout engine's (no recompute forward; the PPO ratio is "
                          "pi / pi_rollout); needs rollout.calculate_log_probs (verl: rollout_correction.bypass_mode)")
    bypass_loss: str = f("ppo_clip", "with bypass_mode: ppo_clip (the PPO loss on pi / pi_rollout; rollout_is adds "
                         "nothing, rollout_rs masks) or reinforce (-w A log pi, w the truncated pi / pi_rollout "
                         "weight of rollout_is, times rollout_rs's mask) (verl: rollout_correction.loss_type)")
    filter_groups: FilterGroupsConfig = f(factory=FilterGroupsConfig, help="DAPO dynamic sampling")
    gdpo_reward_keys: list = f(factory=list, help="gdpo: the reward components normalised separately, names of "
                               "reward_extra/<name> columns (a scorer returning {'score', '<name>', ...})")
    gdpo_reward_weights: list | None = f(None, "gdpo: a weight per gdpo_reward_keys entry; null = all 1.0")


@dataclass
class DebugConfig:
    break_at: Any = f(factory=list, help="phase(s) to pause at: actor.update_policy or a list (needs --debug)")
    check_batch_keys: bool = f(
        False, "check every worker call's output against rlkit/batch_keys.py (shape, dtype, required keys); "
        "on in --debug mode"
    )
    record_steps: list = f(factory=list, help="steps whose update inputs (the batch the actor/critic update receives, "
                           "the RNG states) are saved to <default_local_dir>/steps/ for `rlkit debug replay`; a "
                           "failed step is saved too")
    detect_anomaly: bool = f(
        False, "stop at the first NaN/Inf in a loss, gradient, log-prob, advantage or reward (--debug nan): paused "
        "for the debugger in an interactive --debug run, else the micro-batch is saved under the log dir and the run "
        "stops with one line"
    )


@dataclass
class PrometheusConfig:
    port: int | None = f(None, "serve the run's metrics for Prometheus at http://<host>:<port>/metrics (0 = any free "
                               "port, written to status.json); null = no endpoint")
    host: str = f("127.0.0.1", "address the endpoint binds; any other than loopback needs the token")
    token_env: str = f("RLKIT_PROMETHEUS_TOKEN", "environment variable holding the bearer token scrapes must send "
                                                 "(required when host is not loopback; never put in the config)")


@dataclass
class TrainerConfig:
    project_name: str = f("rlkit", "tracker project")
    experiment_name: str = f("run", "tracker run name")
    logger: Any = f(factory=lambda: ["console", "file"], help="tracker name or list of them (rlkit.utils.tracker_base."
                    "TRACKERS): console, file, tensorboard, wandb, mlflow, swanlab, trackio; a missing package fails "
                    "pre-flight")
    log_val_generations: int = f(0, "validation generations (input, output, score) logged to every tracker per "
                                    "validation, the same N each time (verl's pick: sorted by input, shuffled with "
                                    "seed 42); 0 = none")
    validation_data_dir: str | None = f(None, "dump every validation generation to <dir>/<step>.jsonl (input, "
                                              "output, gts, score, step, reward extras); null = no dump")
    rollout_data_dir: str | None = f(None, "dump every training step's rollouts to <dir>/<step>.jsonl (same fields "
                                           "as validation_data_dir); null = no dump")
    nnodes: int = f(1, "nodes in the cluster")
    n_gpus_per_node: int = f(1, "workers per node (GPUs, or CPU worker processes without a GPU)")
    device: str = f("auto", "auto | cuda | cpu")
    cpus_per_worker: float = f(1.0, "CPU cores reserved per worker process")
    total_epochs: int = f(1, "passes over the training set")
    total_training_steps: int | None = f(None, "stop after this many steps (overrides epochs)")
    val_before_train: bool = f(True, "validate before the first step")
    test_freq: int = f(-1, "validate every N steps (-1 = only at the end)")
    save_freq: int = f(-1, "checkpoint every N steps (-1 = only at the end)")
    default_local_dir: str = f("checkpoints/${trainer.project_name}/${trainer.experiment_name}",
                             "checkpoint root (created and checked writable before Ray starts)")
    log_dir: str | None = f(None, "metrics jsonl / tensorboard dir; null = <default_local_dir>/logs")
    resume_mode: str = f("auto", "auto (newest loadable one; broken ones skipped, saying so) | disable | "
                                         "<path to a global_step_N dir> | resume_path (verl's: resume_from_path)")
    resume_from_path: str | None = f(None, "verl's: the global_step_N folder resume_mode=resume_path loads (one that "
                                     "does not exist yet starts fresh, as verl); read with no other resume_mode")
    max_actor_ckpt_to_keep: int | None = f(2, "keep the last K loadable checkpoints (null = all); "
                                                 "broken ones get no slot")
    seed: int = f(42, "global seed")
    deterministic: bool = f(False, "same seed, config and machine -> identical metrics and weights: torch's "
                                   "deterministic algorithms (+ CUBLAS_WORKSPACE_CONFIG), vLLM's batch-invariant "
                                   "mode where it has one (docs/debugging.md says what still varies)")
    max_worker_restarts: int = f(3, "a worker process that dies (SIGKILL, OOM kill, segfault) restarts the worker "
                                    "groups from the last complete checkpoint, at most this many times a run; "
                                    "0 = stop at the first death")
    hang_timeout_s: float | None = f(600.0, "a phase of a step (gen, update_actor, a validation call, a checkpoint "
                                     "save, ...) that makes no progress for max(this, 5 x its slowest time so far; "
                                     "2 x this before it first finished) is a hang: every process's stack goes to "
                                     "<log dir>/hang_step<N>.txt, the line names the rank and the collective or call "
                                     "it waits in, and the run stops with the resume command; null or 0 = never")
    critic_warmup: int = f(0, "train only the critic for the first k steps: the actor's update and the weight sync "
                           "start at step k + 1 (verl documents k warm-up steps; its code updates the actor from "
                           "step k, one step early)")
    balance_batch: bool = f(True, "balance tokens across data-parallel ranks")
    one_step_off_policy: bool = f(
        False, "async: a separate rollout group generates batch k+1 while the actor trains on batch k "
        "(turns on rollout log-probs and algorithm.rollout_is; see docs/performance.md)"
    )
    fully_async: bool = f(
        False, "fully asynchronous training: a separate rollout group streams samples into a buffer while the actor "
        "trains on full batches from it, at most trainer.staleness_threshold policy versions old (turns on rollout "
        "log-probs and algorithm.rollout_is; see docs/algorithms.md)"
    )
    staleness_threshold: int = f(1, "fully_async: most policy versions a trained sample may lag the policy it updates "
                                    "(0 = on-policy; older samples are dropped and counted: rollout/dropped_stale)")
    partial_rollout_segment: int = f(0, "fully_async: generate in segments of at most this many tokens, so a weight "
                                        "update lands between segments and unfinished samples continue under the "
                                        "new weights (token_policy_version per token); 0 = whole responses")
    rollout_chunk_prompts: int = f(2, "fully_async: prompts (whole groups of rollout.n samples) per generation "
                                      "request the pump keeps in flight; must divide data.train_batch_size")
    rollout_workers_per_node: int = f(1, "one_step_off_policy / fully_async: rollout worker processes per node")
    rollout_cpus_per_worker: float = f(1.0, "one_step_off_policy / fully_async: CPU cores reserved per rollout "
                                            "worker")
    plugins: list = f(factory=list, help="modules imported first, by the driver and every worker: register your "
                      "own estimators, losses, reward managers there (dotted names, found from the current dir)")
    debug: DebugConfig = f(factory=DebugConfig, help="debugging switches")
    prometheus: PrometheusConfig = f(factory=PrometheusConfig, help="an optional Prometheus /metrics endpoint of the "
                                     "run (docs/watching.md)")

    @property
    def separate_rollout(self) -> bool:
        """Whether the rollout engines have a worker group of their own (an async mode) instead of the actor's."""
        return bool(self.one_step_off_policy or self.fully_async)


@dataclass
class RLConfig:
    data: DataConfig = f(factory=DataConfig, help="datasets")
    actor_rollout_ref: ActorRolloutRefConfig = f(factory=ActorRolloutRefConfig, help="policy, rollout, reference")
    critic: CriticConfig = f(factory=CriticConfig, help="value model (PPO/GAE)")
    reward_model: RewardModelConfig = f(factory=RewardModelConfig, help="rewards: rule scorers, reward model, judge")
    custom_reward_function: CustomRewardConfig = f(factory=CustomRewardConfig, help="your own reward")
    algorithm: AlgorithmConfig = f(factory=AlgorithmConfig, help="advantages, KL, DAPO")
    trainer: TrainerConfig = f(factory=TrainerConfig, help="loop, resources, checkpoints, logging")
    global_profiler: GlobalProfilerConfig = f(factory=GlobalProfilerConfig, help="per-step torch profiler traces "
                                              "of the worker calls (docs/performance.md)")
    distillation: DistillationConfig = f(factory=DistillationConfig, help="on-policy distillation from teachers "
                                         "(docs/distillation.md)")
    ray_kwargs: RayKwargsConfig = f(factory=RayKwargsConfig, help="what the run passes to ray.init (verl's keys)")


#: keys that did nothing and were removed; naming one is an error that says what to do instead
REMOVED_KEYS: dict[str, str] = {
    "actor_rollout_ref.rollout.update_weights_bucket_mb": "the weight sync has no bucket size to set",
}
