"""verl's `data.apply_chat_template_kwargs` (e.g. Qwen3's `enable_thinking: false`): the keywords reach the chat
template wherever an RL prompt is rendered: the run's (and the pre-flight's) dataset, and the agent loop's renderer."""

from __future__ import annotations

from rlkit.data import RLDataset
from rlkit.data.user_dataset import rl_dataset_keys
from rlkit.rollout.agent.chat import ChatRenderer
from rlkit.testing import CHAT_TEMPLATE, build_tiny_tokenizer
from rlkit.trainer.run.run_config import load_config

from .conftest import toy_row

# the template renders two extra words when the caller says enable_thinking=false (as Qwen3's empty think block)
THINKING_TEMPLATE = CHAT_TEMPLATE.replace(
    "{{ '<|im_start|> assistant ' }}",
    "{{ '<|im_start|> assistant ' }}{% if enable_thinking is defined and not enable_thinking %}copy copy {% endif %}")


def test_the_key_reaches_the_dataset_and_the_agent_renderer(write_parquet, tmp_path):
    assert THINKING_TEMPLATE != CHAT_TEMPLATE
    tokenizer = build_tiny_tokenizer(chat_template=THINKING_TEMPLATE)
    files = write_parquet([toy_row(0)])
    base = [f"data.train_files={files}", f"actor_rollout_ref.model.path={tmp_path}"]
    plain = load_config("grpo", base)
    cfg = load_config("grpo", [*base, "+data.apply_chat_template_kwargs.enable_thinking=false"])
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert cfg.actor_rollout_ref.rollout.chat_template_kwargs == {"enable_thinking": False}  # the agent loop's copy
    assert plain.actor_rollout_ref.rollout.chat_template_kwargs == {}

    def prompt_ids(c) -> list[int]:
        batch = RLDataset(files, tokenizer, 32, **rl_dataset_keys(c.data, None)).get_batch([0])
        return batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()

    copy = tokenizer.convert_tokens_to_ids("copy")
    assert prompt_ids(cfg) == [*prompt_ids(plain), copy, copy]

    messages = toy_row(0)["prompt"]
    renderer = ChatRenderer(tokenizer, template_kwargs=cfg.actor_rollout_ref.rollout.chat_template_kwargs)
    assert renderer.render(messages, add_generation_prompt=True).endswith("assistant copy copy ")
    assert not ChatRenderer(tokenizer).render(messages, add_generation_prompt=True).endswith("copy ")
