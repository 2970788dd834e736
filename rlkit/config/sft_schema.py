"""The typed schema of supervised runs (`rlkit train sft`), in verl's SFT key names (sft_trainer_engine.yaml and the
older fsdp_sft_trainer's single-turn keys). Every field has verl's default where verl has the key, and a one-line
help. verl's SFT keys that are not fields here are rules of rlkit/config/verl_sft_keys.py.

Its own schema, not a section of RLConfig: an SFT run has no rollout, reward or algorithm, and verl spells its SFT
keys at the top level (`data.max_length`, `model.path`, `optim.lr`). A preference trainer (DPO) extends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.config.fsdp import FSDPConfig
from rlkit.config.schema import OptimConfig, check_compile_setting, f

PAD_MODES = ("no_padding", "right")


@dataclass
class SFTDataConfig:
    train_files: Any = f("~/data/gsm8k/train.parquet", "parquet file(s) of conversations (`rlkit data gsm8k --format "
                         "sft`, `rlkit data messages FILE.jsonl`) or of prompt/response columns")
    val_files: Any = f(None, "parquet file(s) for the validation loss and perplexity; null = no validation")
    train_batch_size: int = f(256, "conversations per optimizer step, over all workers")
    micro_batch_size_per_gpu: int = f(4, "conversations per forward/backward on each worker (also the validation "
                                      "micro-batch) when use_dynamic_bsz is off")
    use_dynamic_bsz: bool = f(True, "micro-batches bounded by max_token_len_per_gpu tokens instead of a count")
    max_token_len_per_gpu: int = f(8192, "token budget per micro-batch when use_dynamic_bsz")
    train_max_samples: int | None = f(-1, "use only the first N training rows; -1 or null = all")
    val_max_samples: int | None = f(-1, "use only the first N validation rows; -1 or null = all")
    messages_key: str = f("messages", "column of the multi-turn conversations (lists of {role, content}); used when "
                          "the file has it, else prompt_key/response_key")
    tools_key: str = f("tools", "column of each conversation's tool schemas (passed to the chat template); absent "
                       "= no tools")
    enable_thinking_key: str = f("enable_thinking", "column whose value is passed as the chat template's "
                                 "enable_thinking; absent = enable_thinking_default")
    enable_thinking_default: Any = f("none", "enable_thinking for rows without enable_thinking_key: true | false | "
                                     "none (not passed to the template)")
    prompt_key: str = f("prompt", "single-turn files: the prompt column (a string, or a dict read by "
                        "prompt_dict_keys)")
    response_key: str = f("response", "single-turn files: the response column (a string, or a dict read by "
                          "response_dict_keys)")
    prompt_dict_keys: Any = f(None, "single-turn: keys whose values, joined, make the prompt when the prompt column "
                              "holds dicts; null = the column is a string")
    response_dict_keys: Any = f(None, "single-turn: keys whose values, joined, make the response when the response "
                                "column holds dicts; null = the column is a string")
    pad_mode: str = f("no_padding", "no_padding: pack each micro-batch's tokens into one row, each conversation "
                      "attending only to itself (varlen) | right: right-padded rows")
    max_length: int = f(1024, "longest conversation in tokens (chat template included)")
    truncation: str = f("error", "over-long conversations: error (naming the row) | left | right (cut that side)")
    apply_chat_template_kwargs: dict = f(factory=dict, help="extra keywords of the chat template (e.g. "
                                         "{enable_thinking: false})")
    shuffle: bool = f(True, "shuffle the training rows each epoch (seeded by trainer.seed, resumable)")


@dataclass
class SFTModelConfig:
    path: str = f("smollm2-135m-instruct", "HF folder, hub id, .gguf file or alias (see `rlkit model list`)")
    trust_remote_code: bool = f(False, "allow custom model code from the model folder")
    enable_gradient_checkpointing: bool = f(True, "recompute activations in backward to save memory")
    use_remove_padding: bool = f(False, "verl's switch of its padding-free path; rlkit packs as data.pad_mode says")
    attn_implementation: str = f("sdpa", "attention kernel passed to transformers")
    lora_rank: int = f(0, "LoRA rank (peft); 0 = full fine-tuning (docs/lora.md)")
    lora_alpha: float = f(16, "LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)")
    target_modules: Any = f("all-linear", "modules that get an adapter: all-linear or a list of module names")
    exclude_modules: Any = f(None, "module names (list) or a regex that get no adapter; null = none")
    lora_adapter_path: str | None = f(None, "start from this PEFT adapter folder (its rank/alpha/targets win)")
    use_fused_kernels: bool = f(False, "log-probs straight from the hidden states, the LM head run in chunks and "
                                "recomputed in backward (no tokens x vocab logits kept; docs/performance.md)")
    logits_chunk_size: int = f(1024, "rows of logits turned into log-probs at a time (bounds memory)")
    use_torch_compile: Any = f("auto", "torch.compile (inductor) each decoder layer, dynamic shapes, compiled code "
                               "cached across runs: true | false | auto (on for models of >= 50M parameters; "
                               "docs/performance.md)")

    def __post_init__(self) -> None:
        check_compile_setting(self.use_torch_compile, "model.use_torch_compile")


@dataclass
class SFTOptimConfig(OptimConfig):
    lr: float = f(1e-3, "peak learning rate (verl's optim default; fine-tuning usually wants 1e-5)")
    clip_grad: float = f(1.0, "max grad norm")


@dataclass
class SFTTrainerConfig:
    default_local_dir: str = f("checkpoints/${trainer.project_name}/${trainer.experiment_name}",
                               "checkpoint root (created and checked writable before Ray starts)")
    project_name: str = f("gsm8k-sft", "tracker project")
    experiment_name: str = f("test", "tracker run name")
    total_epochs: int = f(4, "passes over the training set")
    total_training_steps: int | None = f(None, "stop after this many steps (overrides epochs)")
    logger: Any = f(factory=lambda: ["console", "file"], help="tracker name or list of them (console, file, "
                    "tensorboard, wandb, mlflow, swanlab)")
    log_dir: str | None = f(None, "metrics jsonl / tensorboard dir; null = <default_local_dir>/logs")
    seed: int = f(1, "global seed (init, data order)")
    save_freq: int = f(-1, "checkpoint every N steps (-1 = only at the end)")
    test_freq: int = f(-1, "validation loss every N steps (-1 = only at the end)")
    val_before_train: bool = f(True, "validation loss before the first step (the 'before' of the run summary)")
    max_ckpt_to_keep: int | None = f(None, "keep the last K loadable checkpoints (null = all)")
    balance_batch: bool = f(True, "balance tokens across data-parallel workers")
    resume_mode: str = f("auto", "auto (newest loadable one) | disable | <path to a global_step_N dir>")
    device: str = f("auto", "auto | cuda | cpu")
    nnodes: int = f(1, "nodes in the cluster")
    n_gpus_per_node: int = f(1, "workers per node (GPUs, or CPU worker processes without a GPU)")
    cpus_per_worker: float = f(1.0, "CPU cores reserved per worker process")

    @property
    def max_actor_ckpt_to_keep(self) -> int | None:
        """The name the shared fit loop (TrainerBase) reads."""
        return self.max_ckpt_to_keep


@dataclass
class SFTConfig:
    data: SFTDataConfig = f(factory=SFTDataConfig, help="conversations and batching")
    model: SFTModelConfig = f(factory=SFTModelConfig, help="the trained model (LoRA included)")
    engine: FSDPConfig = f(factory=FSDPConfig, help="FSDP2 settings")
    optim: SFTOptimConfig = f(factory=SFTOptimConfig, help="optimizer and LR schedule")
    trainer: SFTTrainerConfig = f(factory=SFTTrainerConfig, help="loop, resources, checkpoints, logging")
