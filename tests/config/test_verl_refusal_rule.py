"""Issue 43's rule for verl's keys: a key that tunes speed, memory, parallel layout, logging, profiling, checkpoint
housekeeping or the launcher is accepted with one line saying what rlkit does instead; only a value that would
change what is computed, and that rlkit cannot compute, is refused."""

from __future__ import annotations

import pytest
import yaml

from rlkit.config.load import compose_config
from rlkit.errors import UserError

HF = ["actor_rollout_ref.rollout.name=hf"]
R = "actor_rollout_ref.rollout"


@pytest.mark.parametrize("override", [
    "actor_rollout_ref.hybrid_engine=false",                                   # layout
    f"{R}.checkpoint_engine.backend=nccl",                                     # weight-sync transport
    f"+{R}.cudagraph_capture_sizes=[1,2,4]",                                   # speed
    f"{R}.data_parallel_size=2",                                               # parallel layout
    f"{R}.prometheus.enable=true",                                             # monitoring
    f"{R}.scheduling_policy=priority",                                         # serving order
    f"{R}.trace.backend=weave",                                                # logging
    f"+{R}.sglang_rollout_mode=server",                                        # the engine's launch mode
    f"+{R}.engine_kwargs.sglang.attention_backend=ascend",                     # another engine's arguments
    "reward_model.sandbox_fusion.url=http://sandbox:8080/run_code",            # where code runs
    "reward_model.launch_reward_fn_async=true",                                # speed
    "trainer.default_hdfs_dir=hdfs://ckpt",                                    # checkpoint copies
    "trainer.del_local_ckpt_after_load=true",                                  # checkpoint housekeeping
    "+transfer_queue.enable=true",                                             # batch transport
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",         # memory
    "+actor_rollout_ref.actor.fsdp_config.pad_to_length=4096",                 # padding
    "actor_rollout_ref.actor.optim.exp_avg_dtype=bf16",                        # optimizer memory
    "actor_rollout_ref.model.use_liger=true",                                  # kernels
    "actor_rollout_ref.model.enable_activation_offload=true",                  # memory
    "actor_rollout_ref.actor.checkpoint.async_save=true",                      # checkpoint speed
    "global_profiler.profile_continuous_steps=true",                           # profiling
    "+global_profiler.relocate_results=true",                                  # profiling
    "+actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=2",   # profiling
    "+actor_rollout_ref.profiler.ranks=[0,4]",                                # profiling (older layout)
    "+trainer.profile_steps=[1,2]",                                            # profiling (older layout)
    "+actor_rollout_ref.model.enable_activation_offloading=true",              # memory (older spelling)
    "+reward_model.megatron.tensor_model_parallel_size=2",                    # parallel layout
    f"+{R}.checkpoint_engine.backend=nccl",                                   # weight-sync transport
])
def test_speed_memory_layout_logging_and_launcher_keys_are_accepted_with_one_line(override):
    notices: list[str] = []
    compose_config(None, HF + [override], notices=notices)
    key = override.lstrip("+").split("=")[0]
    said = [n for n in notices if key in n]
    assert len(said) == 1 and "->" in said[0] and "\n" not in said[0], notices


def test_an_empty_value_of_a_boolean_key_is_false_as_verl_reads_it():
    notices: list[str] = []  # `data.return_raw_chat=$return_raw_chat` with the variable set only in another branch
    cfg = compose_config(None, HF + ["data.return_raw_chat=", "actor_rollout_ref.actor.use_kl_loss=true",
                                     "actor_rollout_ref.actor.use_kl_loss="], notices=notices)
    assert cfg.data.return_raw_chat is False and cfg.actor_rollout_ref.actor.use_kl_loss is False
    assert sum("(empty) -> data.return_raw_chat=false" in n for n in notices) == 1
    with pytest.raises(UserError, match="data.train_batch_size"):
        compose_config(None, HF + ["data.train_batch_size="])  # not a boolean: still the type error


def test_a_profiler_rlkit_does_not_run_turns_profiling_off_with_why():
    notices: list[str] = []
    cfg = compose_config(None, HF + ["global_profiler.tool=nsys", "global_profiler.steps=[1]"], notices=notices)
    assert cfg.global_profiler.tool is None
    assert any(n.startswith("verl key global_profiler.tool=nsys -> global_profiler.tool=null, no profiler runs: ")
               for n in notices)


def test_cuda_memory_snapshots_without_cuda_turn_profiling_off_with_why():
    import torch

    notices: list[str] = []
    cfg = compose_config(None, HF + ["global_profiler.tool=torch_memory", "global_profiler.steps=[1]"],
                         notices=notices)
    if torch.cuda.is_available():
        assert cfg.global_profiler.tool == "torch_memory" and not notices
    else:
        assert cfg.global_profiler.tool is None and notices == [
            "verl key global_profiler.tool=torch_memory -> global_profiler.tool=null, no profiler runs: CUDA memory "
            "snapshots need a GPU and this machine has none"]


def test_a_lone_brace_in_a_value_is_text():
    cfg = compose_config(None, HF + ["trainer.experiment_name=qwen3_4b_grpo_8npu}"])  # as a verl script spells it
    assert cfg.trainer.experiment_name == "qwen3_4b_grpo_8npu}"


def test_another_engines_arguments_in_a_yaml_are_dropped_and_vllms_kept(tmp_path):
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump({"actor_rollout_ref": {"rollout": {"engine_kwargs": {
        "vllm": {"swap_space": 4}, "sglang": {"attention_backend": "fa3"}, "trtllm": {}}}}}))
    notices: list[str] = []
    cfg = compose_config(None, HF, str(conf), notices=notices)
    assert cfg.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {"swap_space": 4}, "sglang": {}, "trtllm": {}}
    assert sum("the sglang arguments dropped" in n for n in notices) == 1


@pytest.mark.parametrize("override, why", [
    ("trainer.device=npu", "Ascend NPUs"),                                     # an accelerator rlkit does not drive
    ("actor_rollout_ref.actor.qat.enable=true", "quantisation-aware"),         # an algorithm it lacks
    ("data.audio_key=audio", "audio"),                                         # data it cannot read
    (f"{R}.logprobs_mode=raw_logprobs", "processed"),                          # a different computed quantity
])
def test_what_changes_the_computation_and_rlkit_lacks_is_still_refused(override, why):
    with pytest.raises(UserError) as err:
        compose_config(None, HF + [override])
    assert override.split("=")[0] in str(err.value) and why in str(err.value)


def test_the_sft_trainers_profiling_and_launcher_keys_are_accepted_with_one_line():
    from rlkit.config.sft_load import load_sft_config

    overrides = ["profiler.enable=true", "trainer.profile_interval=[2,4]", "trainer.default_hdfs_dir=hdfs://ckpt",
                 "engine.reshard_after_forward=false", "engine.full_determinism=true",
                 "data.ignore_input_ids_mismatch=true", "model.lora_adapter_name=mine"]
    notices: list[str] = []
    load_sft_config(["data.train_files=/d/t.parquet", *overrides], notices=notices)
    for override in overrides:
        key = override.split("=")[0]
        assert sum(n.startswith(f"verl key {key}=") and "-> nothing to set" in n for n in notices) == 1, (key, notices)
