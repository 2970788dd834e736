"""verl keys that name engines, resume paths or speed-only switches: each maps onto what rlkit computes, with one
line (model_engine / strategy FSDP variants and veomni.*, resume_from_path not there yet, over_sample_rate,
use_prefix_grouper)."""

from __future__ import annotations

import pytest

from rlkit.config.load import compose_config
from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config

HF = ["actor_rollout_ref.rollout.name=hf"]
ACTOR = "actor_rollout_ref.actor"


def _compose(overrides: list[str]) -> tuple[object, str]:
    notices: list[str] = []
    cfg = compose_config(None, HF + overrides, notices=notices)
    return cfg, "\n".join(notices)


@pytest.mark.parametrize("engine", ["dp", "veomni", "torchtitan", "megatron"])
def test_model_engine_names_run_as_fsdp2_with_a_line(engine):
    _, said = _compose([f"model_engine={engine}"])
    assert f"model_engine={engine} -> FSDP2" in said


@pytest.mark.parametrize("strategy", ["veomni", "fsdp_turbo", "fsdp"])
def test_fsdp_variant_strategies_run_as_fsdp2(strategy):
    _, said = _compose([f"{ACTOR}.strategy={strategy}", f"critic.strategy={strategy}"])
    assert f"{ACTOR}.strategy={strategy} -> FSDP2" in said and f"critic.strategy={strategy} -> FSDP2" in said


def test_an_engine_rlkit_does_not_have_is_one_line():
    with pytest.raises(UserError, match="model_engine=xla.*run as FSDP2"):
        _compose(["model_engine=xla"])


def test_veomni_section_lands_on_rlkits_fsdp_keys():
    cfg, said = _compose([f"{ACTOR}.veomni.param_offload=true", f"{ACTOR}.veomni.optimizer_offload=true",
                          f"{ACTOR}.veomni.fsdp_size=2", f"{ACTOR}.veomni.ulysses_parallel_size=2",
                          f"{ACTOR}.veomni.attn_implementation=flash_attention_2",
                          f"{ACTOR}.veomni.expert_parallel_size=4", "actor_rollout_ref.ref.veomni.param_offload=true",
                          f"{ACTOR}.veomni.router_replay.mode=R3"])
    actor = cfg.actor_rollout_ref.actor
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload and actor.fsdp_config.fsdp_size == 2
    assert actor.ulysses_sequence_parallel_size == 2 and actor.router_replay is True
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert "attn_implementation=flash_attention_2 -> a VeOmni kernel choice" in said
    assert actor.fsdp_config.expert_parallel_size == 4  # expert parallel (rlkit/workers/expert_parallel.py)
    with pytest.raises(UserError, match="load_checkpoint_path"):
        _compose([f"{ACTOR}.veomni.load_checkpoint_path=/ckpt"])


def test_resume_path_that_does_not_exist_yet_starts_fresh(tmp_path, caplog):
    missing = tmp_path / "ckpt" / "global_step_10"
    cfg = load_config(None, HF + ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={missing}"])
    assert cfg.trainer.resume_mode == "disable" and "does not exist yet: the run starts fresh" in caplog.text
    missing.mkdir(parents=True)
    cfg = load_config(None, HF + ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={missing}"])
    assert cfg.trainer.resume_mode == str(missing)
    cfg = load_config(None, HF + [f"trainer.resume_from_path={missing}"])  # verl reads it only with resume_path
    assert cfg.trainer.resume_mode == "auto" and "read only with trainer.resume_mode=resume_path" in caplog.text
    with pytest.raises(UserError, match="resume_mode=resume_path needs trainer.resume_from_path"):
        load_config(None, HF + ["trainer.resume_mode=resume_path"])


def test_speed_only_switches_are_mapped_with_a_line():
    _, said = _compose([f"{ACTOR}.use_prefix_grouper=true", "actor_rollout_ref.rollout.over_sample_rate=0.1"])
    assert "use_prefix_grouper=true -> nothing to set" in said and "the log-probs are the same" in said
    assert "over_sample_rate=0.1 -> nothing to set" in said


M = "actor_rollout_ref.model"


def test_verls_newer_lora_section_sets_rlkits_lora_keys():
    cfg = load_config(None, HF + [f"{M}.lora.rank=8", f"{M}.lora.alpha=16", f"{M}.lora.merge=true",
                                  f"{M}.lora.target_modules=[linear_qkv,linear_proj]"])
    model = cfg.actor_rollout_ref.model
    assert model.lora_rank == 8 and model.lora_alpha == 16 and cfg.actor_rollout_ref.rollout.max_lora_rank == 8
    assert model.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    older = load_config(None, HF + [f"{M}.lora_rank=8", f"{M}.lora_alpha=16",
                                    f"{M}.target_modules=[q_proj,k_proj,v_proj,o_proj]"])
    assert older.actor_rollout_ref.model == model  # the same LoRA either way
    alone = load_config(None, HF + [f"{M}.lora.rank=4"]).actor_rollout_ref.model
    assert alone.lora_alpha == 32  # verl's section's own default alpha


def test_both_lora_spellings_set_differently_is_one_line_and_tuning_keys_say_so():
    with pytest.raises(UserError, match="lora.rank=8 and actor_rollout_ref.model.lora_rank=16 set LoRA twice"):
        load_config(None, HF + [f"{M}.lora.rank=8", f"{M}.lora_rank=16"])
    same = load_config(None, HF + [f"{M}.lora.rank=8", f"{M}.lora_rank=8"])
    assert same.actor_rollout_ref.model.lora_rank == 8
    notices: list[str] = []
    load_config(None, HF + [f"{M}.lora.rank=8", f"{M}.lora.lora_A_init_method=xavier", f"{M}.lora.type=lora"],
                notices=notices)
    assert any("lora.lora_A_init_method=xavier -> nothing to set" in n for n in notices)
    with pytest.raises(UserError, match="lora.dropout=0.1.*no dropout"):
        load_config(None, HF + [f"{M}.lora.rank=8", f"{M}.lora.dropout=0.1"])
    with pytest.raises(UserError, match="lora.type=dora"):
        load_config(None, HF + [f"{M}.lora.rank=8", f"{M}.lora.type=dora"])


def test_the_lora_section_from_a_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor_rollout_ref:\n  model:\n    lora: {rank: 4, alpha: 8, merge: true, dropout: 0.0, "
                    "exclude_modules: []}\n  rollout: {name: hf}\n")
    notices: list[str] = []
    model = load_config(None, [], config_file=str(path), notices=notices).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.exclude_modules) == (4, 8, None)
    assert any("nothing to set for dropout, merge" in n for n in notices)


def test_precision_keys_land_on_rlkits_fsdp_dtypes():
    fsdp = f"{ACTOR}.fsdp_config"
    cfg, said = _compose([f"+{fsdp}.mixed_precision.param_dtype=bf16", f"+{fsdp}.mixed_precision.reduce_dtype=bf16",
                          f"+{fsdp}.mixed_precision.buffer_dtype=fp32", f"{fsdp}.model_dtype=bfloat16",
                          f"+{M}.torch_dtype=bfloat16"])
    actor_fsdp = cfg.actor_rollout_ref.actor.fsdp_config
    assert actor_fsdp.param_dtype == "bfloat16" and actor_fsdp.reduce_dtype == "bfloat16"
    assert "model_dtype=bfloat16 -> nothing to set: rlkit keeps float32 master weights" in said
    assert "buffer_dtype=fp32 -> nothing to set" in said and "torch_dtype=bfloat16 -> nothing to set" in said


def test_mtp_is_refused_only_when_it_trains():
    _, said = _compose([f"+{M}.mtp.enable=true", f"+{M}.mtp.enable_rollout=true", f"+{M}.mtp.enable_train=false"])
    assert "mtp.enable_rollout=true -> nothing to set" in said
    with pytest.raises(UserError, match="mtp.enable_train=true.*objective"):
        _compose([f"+{M}.mtp.enable=true", f"+{M}.mtp.enable_train=true"])


@pytest.mark.parametrize("prefix, path_key", [("reward_model", "reward_model.model.path"),
                                              ("reward.reward_model", "reward.reward_model.model_path")])
def test_a_reward_model_served_by_an_engine_is_rlkits_reward_model_role(prefix, path_key):
    cfg, said = _compose([f"{prefix}.enable=true", f"{path_key}=/models/rm", f"{prefix}.rollout.name=vllm",
                          f"{prefix}.rollout.gpu_memory_utilization=0.8", f"{prefix}.rollout.prompt_length=2048"])
    assert cfg.reward_model.enable and cfg.reward_model.model.path == "/models/rm"
    assert cfg.reward_model.style == "classifier"  # verl's reward loop scores a served RM by its score head
    assert f"{prefix}.rollout.name=vllm -> the reward model scores in rlkit's own worker" in said
    assert f"{prefix}.rollout.gpu_memory_utilization=0.8 -> nothing to set" in said
