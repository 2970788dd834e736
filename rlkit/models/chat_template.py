"""verl's `actor_rollout_ref.model.custom_chat_template`: the run's prompts are rendered with this template instead
of the tokenizer's own, everywhere a tokenizer renders a chat (the dataset, the agent loop, validation, the
tokenizer a checkpoint export copies, `rlkit eval` of it).

rlkit does it once, where the model folder is resolved: the run reads the model through a view folder (under the
run's checkpoint root) whose files link to the model's, but whose tokenizer_config.json carries the template, so
every `AutoTokenizer.from_pretrained(model_path)` of the run sees it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlkit.errors import UserError

KEY = "actor_rollout_ref.model.custom_chat_template"
#: files of a model folder that hold a chat template (transformers reads the .jinja one first)
TEMPLATE_FILES = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")
VIEW = "model_view"


def with_chat_template(model_dir: str | Path, template: str | None, root: str | Path) -> Path:
    """`model_dir` itself without a template; else the view folder `root/model_view` (rebuilt each run)."""
    model_dir = Path(model_dir)
    if not template:
        return model_dir
    view = Path(root).expanduser() / VIEW
    if view.exists():
        shutil.rmtree(view)
    view.mkdir(parents=True)
    for entry in model_dir.iterdir():
        if entry.name not in TEMPLATE_FILES:
            (view / entry.name).symlink_to(entry.resolve())
    config_file = model_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    config["chat_template"] = template
    (view / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    _check(view)
    return view


def _check(view: Path) -> None:
    """The template renders a one-turn chat (a broken one is one line here, not a traceback in the first step)."""
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(str(view)).apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja's syntax and render errors, whatever their class
        raise UserError(f"{KEY}: the template does not render a chat ({type(exc).__name__}: {exc}); fix the "
                        "Jinja template") from None
