"""verl's whole config key space: every key of verl's reference configs is implemented, mapped (with its line) or
refused (with its fix), in both layouts; the mapped ones land on rlkit's keys; verl's config names are rlkit's base."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlkit.config.load import compose_config, mapping_keys, schema_keys
from rlkit.config.verl_keys import VERL_KEYS
from rlkit.config.verl_rules import Kind, find_rule, flatten, translate
from rlkit.errors import UserError

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "verl"
LAYOUTS = ["_generated_ppo_trainer.yaml", "_generated_ppo_trainer.b178a3c.yaml", "_generated_ppo_megatron_trainer.yaml"]
HF = ["actor_rollout_ref.rollout.name=hf"]
KNOWN, MAPPINGS = set(schema_keys()), mapping_keys()


def is_rlkit(key: str) -> bool:
    return key in KNOWN or any(key.startswith(m + ".") for m in MAPPINGS)


def reference_keys(name: str) -> dict:
    """verl's leaf keys with their defaults (`_target_`, verl's class names for instantiation, are not settings)."""
    tree = yaml.safe_load((REFERENCE / name).read_text())
    return {k: v for k, v in flatten(tree).items() if not k.endswith("._target_")}


def classify(key: str) -> Kind | None:
    if is_rlkit(key):
        return Kind.IMPLEMENTED
    hit = find_rule(key, VERL_KEYS)
    return hit[0].kind if hit else None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_verl_key_is_implemented_mapped_or_refused(layout):
    keys = reference_keys(layout)
    assert len(keys) > 500  # the files are verl's whole key space, not an excerpt
    unknown = [k for k in keys if classify(k) is None]
    assert not unknown, f"{len(unknown)} verl keys of {layout} have no class: {unknown[:20]}"


def _probe(rule, match, key: str, default) -> dict:
    """A layer that asks for the feature: its group's switch turned on, or a value the rule is not inert to."""
    if rule.switch is not None:
        switch = match.string[: match.start(match.lastindex) - 1] + "." + rule.switch
        return {key: default, switch: True}
    for value in (True, "x-probe", 7, -7, ["x-probe"]):
        if not rule.inert(value):
            return {key: value}
    return {key: default}  # read only by a refused feature: accepted with its line at any value


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_mapped_or_refused_key_says_its_line(layout):
    """Set alone, a mapped key gives one notice naming it; a refused one, asking for its feature, one error naming
    it (a key read only by a refused feature is accepted with a notice)."""
    for key, default in reference_keys(layout).items():
        hit = None if is_rlkit(key) else find_rule(key, VERL_KEYS)
        if hit is None:
            continue
        rule, match = hit
        if rule.kind is not Kind.REFUSED and isinstance(default, str) and default.startswith("${"):
            continue  # verl's own interpolation between its keys: no user writes it
        layer = {key: default} if rule.kind is not Kind.REFUSED else _probe(rule, match, key, default)
        try:
            done = translate(layer, VERL_KEYS, is_rlkit, "a test")
        except UserError as exc:
            assert rule.kind is Kind.REFUSED or "not supported" in str(exc), (key, str(exc))
            assert "is not supported by rlkit" in str(exc) and str(exc).count("\n") == 0
            continue
        assert key in done.dropped
        if rule.kind is Kind.IMPLEMENTED:
            assert not done.notices  # an alias moves the value without a word
        else:
            assert any(key.rsplit(".", 1)[0] in line for line in done.notices), (key, done.notices)


def test_the_old_and_new_reward_layouts_land_on_the_same_keys():
    new = compose_config(None, HF + ["reward.reward_manager.name=dapo", "reward.custom_reward_function.path=/r.py",
                                     "reward.num_workers=3"])
    old = compose_config(None, HF + ["reward_model.reward_manager=dapo", "custom_reward_function.path=/r.py",
                                     "reward_model.num_workers=3"])
    assert new == old and new.reward_model.reward_manager == "dapo" and new.custom_reward_function.path == "/r.py"


def test_mapped_keys_set_rlkit_keys_and_say_so():
    notices: list[str] = []
    cfg = compose_config(None, HF + [
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",  # a verl dict under what is one value in rlkit
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.context_parallel_size=2",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
        "actor_rollout_ref.actor.optim.clip_grad=0.5",
        "+actor_rollout_ref.actor.fsdp_config.dtype=bf16",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.model.use_fused_kernels=true",
        "algorithm.rollout_correction.rollout_is=sequence",
    ], notices=notices)
    actor = cfg.actor_rollout_ref.actor
    assert cfg.algorithm.adv_estimator == "gae"  # no preset: verl's default estimator
    assert actor.policy_loss == "gspo" and actor.grad_clip == 0.5 and actor.ulysses_sequence_parallel_size == 2
    assert actor.fsdp_config.param_dtype == "bfloat16" and cfg.algorithm.rollout_is == "sequence"
    assert cfg.actor_rollout_ref.model.fused_lm_head is True and cfg.actor_rollout_ref.model.use_torch_compile is False
    said = "\n".join(notices)
    assert actor.fsdp_config.tensor_parallel_size == 4  # DTensor tensor parallel under rlkit's key
    assert "strategy=megatron -> FSDP2" in said and "tensor_model_parallel_size" not in said
    assert "policy_loss" not in said  # implemented under rlkit's name: no line


@pytest.mark.parametrize("override, fix", [
    ("trainer.device=npu", "trainer.device=cuda, cpu or auto"),
    ("actor_rollout_ref.actor.qat.enable=true", "quantisation-aware training"),
    ("actor_rollout_ref.model.mtp.enable_train=true", "set enable_train=false"),
    ("data.video_key=clips", "data.image_key"),
])
def test_refused_keys_name_the_key_and_the_fix(override, fix):
    with pytest.raises(UserError) as err:
        compose_config(None, HF + [override])
    assert override.split("=")[0] in str(err.value) and fix in str(err.value)


def test_a_refused_feature_left_off_is_accepted_with_a_line():
    notices: list[str] = []
    compose_config(None, HF + ["actor_rollout_ref.actor.profiler.enable=false", "actor_rollout_ref.hybrid_engine=true",
                               "actor_rollout_ref.actor.profiler.tool_config.npu.level=level1"], notices=notices)
    assert any("profiler.tool_config.npu.level=level1 -> nothing to set" in n for n in notices)
    assert any("hybrid_engine=true" in n for n in notices)


def test_verls_distillation_keys_are_read(tmp_path):
    """verl's distillation group as its yaml spells it (dataclass targets, a teacher's inference block) is read."""
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"distillation": {
        "_target_": "verl.workers.config.DistillationConfig", "enabled": True,
        "distillation_loss": {"_target_": "verl.workers.config.DistillationLossConfig", "loss_mode": "k1",
                              "use_policy_gradient": True, "clip_ratio_high": 0.28, "loss_max_clamp": 10.0},
        "teacher_models": {"teacher_model": {"_target_": "verl.workers.config.DistillationTeacherModelConfig",
                                             "key": None, "model_path": "/models/teacher", "num_replicas": 0,
                                             "inference": {"tensor_model_parallel_size": 2}}},
        "teacher_key": "data_source"}}))
    notices: list[str] = []
    cfg = compose_config(None, HF, config_file=str(tmp_path / "run.yaml"), notices=notices)
    d = cfg.distillation
    assert d.enabled and d.distillation_loss.loss_mode == "k1" and d.distillation_loss.use_policy_gradient
    assert d.distillation_loss.clip_ratio_high == 0.28 and d.distillation_loss.loss_max_clamp == 10.0
    assert d.teacher_models["teacher_model"]["model_path"] == "/models/teacher"
    assert any("distillation._target_" in n for n in notices)


@pytest.mark.parametrize("name, strategy_line", [("ppo_trainer", False), ("ppo_megatron_trainer", True)])
def test_verls_config_names_are_rlkits_base(tmp_path, name, strategy_line):
    """`--config-path <verl's folder> --config-name ppo_trainer`, whether or not the folder is here."""
    notices: list[str] = []
    cfg = compose_config(None, HF, config_path=str(tmp_path / "verl" / "trainer" / "config"), config_name=name,
                         notices=notices)
    assert cfg.algorithm.adv_estimator == "gae"
    assert any("strategy=megatron" in n for n in notices) is strategy_line


def test_a_user_tree_over_verls_base_with_verl_keys(tmp_path):
    """A recipe's own config (DAPO-style): `defaults: [ppo_trainer, _self_]` and verl keys in the file."""
    (tmp_path / "dapo_trainer.yaml").write_text(yaml.safe_dump({
        "hydra": {"searchpath": ["file://verl/trainer/config"]},
        "defaults": ["ppo_trainer", "_self_"],
        "data": {"max_prompt_length": 64},
        "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "gspo"}, "optim": {"clip_grad": 0.3}},
                              "rollout": {"name": "sglang"}},
        "algorithm": {"adv_estimator": "grpo", "filter_groups": {"enable": True, "metric": "acc"}},
    }))
    notices: list[str] = []
    cfg = compose_config(None, ["trainer.total_training_steps=3"], config_path=str(tmp_path),
                         config_name="dapo_trainer", notices=notices)
    assert cfg.actor_rollout_ref.actor.policy_loss == "gspo" and cfg.actor_rollout_ref.actor.grad_clip == 0.3
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.algorithm.filter_groups.enable
    assert cfg.data.max_prompt_length == 64 and cfg.algorithm.adv_estimator == "grpo"
    assert any("rollout.name=sglang -> actor_rollout_ref.rollout.name=vllm" in n for n in notices)
    assert any("filter_groups.metric=acc" in n for n in notices)


def test_docs_verl_md_is_current():
    from rlkit.config.verl_doc import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "verl.md"
    assert doc.read_text() == render(), "regenerate: python -m rlkit.config.verl_doc > docs/verl.md"
