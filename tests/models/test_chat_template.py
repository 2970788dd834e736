"""verl's model.custom_chat_template: the run's model folder is a view whose tokenizer renders chats with the given
template (every tokenizer the run loads from it), the model folder itself untouched; a broken template is one line."""

from __future__ import annotations

import pytest
import yaml

from rlkit.errors import UserError
from rlkit.models.chat_template import with_chat_template
from rlkit.models.loading import load_tokenizer
from rlkit.testing import save_tiny_model
from rlkit.trainer.run.run_config import load_config

TEMPLATE = ("{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}>>{% endif %}")
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2)


def test_the_run_renders_prompts_with_the_custom_template(model_path, tmp_path):
    before = load_tokenizer(model_path).apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    view = with_chat_template(model_path, TEMPLATE, tmp_path / "run")
    rendered = load_tokenizer(view).apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == "<<user>>hi>>" and before != rendered
    assert (view / "config.json").resolve() == (model_path / "config.json").resolve()  # the weights are the model's
    again = load_tokenizer(model_path).apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert again == before  # the model folder itself is untouched
    assert with_chat_template(model_path, TEMPLATE, tmp_path / "run") == view  # a second run rebuilds it in place
    assert with_chat_template(model_path, None, tmp_path / "run") == model_path


def test_a_broken_template_is_one_line(model_path, tmp_path):
    with pytest.raises(UserError, match="custom_chat_template: the template does not render"):
        with_chat_template(model_path, "{% for m in messages %}", tmp_path / "run")


def test_the_config_takes_verls_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"actor_rollout_ref": {"model": {"custom_chat_template": TEMPLATE},
                                                          "rollout": {"name": "hf"}}}))
    cfg = load_config("grpo", [], config_file=str(path))
    assert cfg.actor_rollout_ref.model.custom_chat_template == TEMPLATE
