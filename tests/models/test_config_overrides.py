"""verl's model.override_config: the values are on the HF config the trainer's model is built from (and handed to the
vLLM engine as hf_overrides); verl's Megatron nesting is read; a name the config lacks is one line."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.fsdp import FSDPConfig
from rlkit.errors import UserError
from rlkit.testing import save_tiny_model
from rlkit.trainer.run.run_config import load_config
from rlkit.workers.fsdp_model import FSDPModel

OV = "actor_rollout_ref.model.override_config"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2)


def test_the_trainers_model_is_built_with_the_overrides(model_path):
    plain = FSDPModel(str(model_path), FSDPConfig(param_dtype="float32"), torch.device("cpu"))
    model = FSDPModel(str(model_path), FSDPConfig(param_dtype="float32"), torch.device("cpu"),
                      config_overrides={"attention_dropout": 0.5, "max_position_embeddings": 77})
    assert model.module.config.attention_dropout == 0.5 and model.module.config.max_position_embeddings == 77
    ids = torch.arange(1, 9).reshape(1, 8)
    model.module.load_state_dict(plain.module.state_dict())
    plain.module.train()
    model.module.train()
    torch.manual_seed(0)
    with torch.no_grad():
        same = torch.allclose(plain.module(input_ids=ids).logits, plain.module(input_ids=ids).logits)
        dropped = not torch.allclose(model.module(input_ids=ids).logits, model.module(input_ids=ids).logits)
    assert same and dropped  # the overridden attention dropout is what the model computes with


def test_a_name_the_config_lacks_is_one_line(model_path):
    with pytest.raises(UserError, match="override_config.no_such_setting: the model's config"):
        FSDPModel(str(model_path), FSDPConfig(param_dtype="float32"), torch.device("cpu"),
                  config_overrides={"no_such_setting": 1})


def test_the_config_reads_verls_spellings_and_the_engine_gets_them():
    hf = ["actor_rollout_ref.rollout.name=hf"]
    cfg = load_config("grpo", hf + [f"+{OV}.max_position_embeddings=4096", f"+{OV}.model_config.attention_dropout=0.1"])
    assert cfg.actor_rollout_ref.model.override_config == {"max_position_embeddings": 4096, "attention_dropout": 0.1}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"]["hf_overrides"] == {
        "max_position_embeddings": 4096, "attention_dropout": 0.1}
    with pytest.raises(UserError, match="attn_implementation=flash_attention_2: rlkit reads the attention kernel"):
        load_config("grpo", hf + [f"+{OV}.attn_implementation=flash_attention_2"])
