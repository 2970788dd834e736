"""verl's SFT key space: every key of sft_trainer_engine.yaml and of its defaults groups (model: hf_model, engine:
fsdp, optim: fsdp, profiler), and the older fsdp_sft_trainer's keys, is implemented, mapped (with its line) or
refused (with its fix); a verl SFT script's overrides compose into rlkit's SFT config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlkit.config.load import mapping_keys, schema_keys
from rlkit.config.sft_load import load_sft_config
from rlkit.config.sft_schema import SFTConfig
from rlkit.config.verl_rules import Kind, find_rule, flatten
from rlkit.config.verl_sft_keys import VERL_SFT_KEYS
from rlkit.errors import UserError

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "verl" / "sft_trainer_engine.yaml"
KNOWN, MAPPINGS = set(schema_keys(SFTConfig)), mapping_keys(SFTConfig)
# the defaults groups' keys (verl/trainer/config/{model/hf_model,engine/fsdp,optim/fsdp,profiler/profiler}.yaml)
GROUPS = {
    "model": "path hf_config_path tokenizer_path use_shm trust_remote_code custom_chat_template external_lib "
             "override_config enable_gradient_checkpointing enable_activation_offload use_remove_padding lora_rank "
             "lora_alpha target_modules exclude_modules use_liger use_fused_kernels fused_kernel_options",
    "engine": "wrap_policy.min_num_params param_offload optimizer_offload offload_policy reshard_after_forward "
              "fsdp_size forward_prefetch model_dtype use_orig_params ulysses_sequence_parallel_size "
              "entropy_from_logits_with_chunking use_torch_compile entropy_checkpointing forward_only strategy",
    "optim": "optimizer optimizer_impl lr lr_warmup_steps_ratio total_training_steps weight_decay lr_warmup_steps "
             "betas clip_grad min_lr_ratio num_cycles lr_scheduler_type warmup_style override_optimizer_config",
    "profiler": "tool enable all_ranks ranks save_path tool_config.npu.contents tool_config.torch.step_start "
                "tool_config.torch.contents tool_config.torch_memory.stack_depth",
}
# fsdp_sft_trainer.yaml (verl's older SFT trainer), the keys its published scripts set
OLDER = ("data.prompt_key data.response_key data.prompt_dict_keys data.response_dict_keys data.multiturn.enable "
         "data.multiturn.messages_key data.multiturn.tools_key data.micro_batch_size data.chat_template "
         "model.partial_pretrain model.strategy model.fsdp_config.cpu_offload model.fsdp_config.offload_params "
         "model.fsdp_config.model_dtype model.fsdp_config.wrap_policy.min_num_params optim.warmup_steps_ratio "
         "ulysses_sequence_parallel_size use_remove_padding trainer.checkpoint.save_contents")


def classify(key: str) -> Kind | None:
    if key in KNOWN or any(key.startswith(m + ".") for m in MAPPINGS):
        return Kind.IMPLEMENTED
    hit = find_rule(key, VERL_SFT_KEYS)
    return hit[0].kind if hit else None


def verl_keys() -> list[str]:
    tree = yaml.safe_load(REFERENCE.read_text())
    keys = [k for k in flatten(tree) if k != "defaults"]
    keys += [f"{group}.{k}" for group, names in GROUPS.items() for k in names.split()]
    return keys + OLDER.split()


def test_every_verl_sft_key_is_implemented_mapped_or_refused():
    keys = verl_keys()
    assert len(keys) > 100
    unknown = [k for k in keys if classify(k) is None]
    assert not unknown, unknown
    assert {"data.messages_key", "data.max_length", "data.truncation", "data.use_dynamic_bsz", "model.lora_rank",
            "data.prompt_key", "data.response_dict_keys"} <= {k for k in keys if classify(k) is Kind.IMPLEMENTED}


def test_a_verl_sft_script_composes(tmp_path):
    notices: list[str] = []
    cfg = load_sft_config([
        "data.train_files=/d/train.parquet", "data.val_files=/d/test.parquet", "data.multiturn.enable=true",
        "data.multiturn.messages_key=conversation", "data.micro_batch_size=2", "model.partial_pretrain=/m/qwen",
        "model.fsdp_config.cpu_offload=true", "optim.lr=1e-5", "optim.warmup_style=cosine",
        "trainer.logger=console", "ulysses_sequence_parallel_size=1", "use_remove_padding=true",
        "checkpoint.save_contents=[model,optimizer,extra]", f"trainer.resume_from_path={tmp_path}/global_step_5",
    ], notices=notices)
    assert (cfg.data.messages_key, cfg.data.micro_batch_size_per_gpu, cfg.model.path) == ("conversation", 2, "/m/qwen")
    assert cfg.engine.param_offload and cfg.optim.lr_scheduler_type == "cosine" and cfg.trainer.logger == ["console"]
    assert cfg.trainer.resume_mode == "disable"  # verl starts fresh when the folder does not exist yet
    assert any(line.startswith("verl key use_remove_padding=true ->") for line in notices), notices
    # verl's config names are rlkit's SFT base
    assert load_sft_config(["data.train_files=/d/t.parquet"], config_name="sft_trainer_engine").data.max_length == 1024


@pytest.mark.parametrize("override, words", [
    ("engine=megatron", "Megatron is not in rlkit"),  # sequence parallelism (a layout) is accepted: the scripts' test
    ("data.custom_cls.path=my.py", "rlkit data messages"),
    ("data.pad_mode=left_right", "data.pad_mode=left_right is not supported"),
    ("data.max_lenght=10", "Closest valid keys: data.max_length"),
    ("data.train_batch_size=3", None),
])
def test_refused_keys_say_why_in_one_line(override, words):
    args = ["data.train_files=/d/t.parquet", override]
    if words is None:  # 3 conversations over 2 workers
        with pytest.raises(UserError, match="divisible by the 2 workers"):
            load_sft_config([*args, "trainer.n_gpus_per_node=2"])
        return
    with pytest.raises(UserError, match=words) as err:
        load_sft_config(args)
    assert "\n" not in str(err.value)
