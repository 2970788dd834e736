"""How a vision-language family writes its images into the prompt's token ids, one entry per family.

The chat template renders one image token per image (`<|image_pad|>` for the Qwen2-VL family, `<image>` for
Idefics3/SmolVLM). The trained model's forward needs that token widened to the image's features (the expanded
ids); a vLLM engine reads the rendered form, one image token per image, and widens it itself from the images it
is handed. So each family says three things: its processor tensors for one row's images (`process`), the
expansion (`expand`) and its inverse (`collapse`), with `collapse(expand(ids)) == ids`.

Entries are registered under the class name of the processor object the family loads (`load_image_processor`,
rlkit/models/loading.py): an image processor for the Qwen2-VL family, whose full processor needs torchvision for
its video part; the full `Idefics3Processor` for Idefics3, whose `image_seq_len` the expansion reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlkit.data.images import PLACEHOLDER, VisionTokens, process_images
from rlkit.errors import UserError
from rlkit.registry import Registry


class ImagePrompt:
    """A family's image tokens: `prepare` turns a rendered prompt and its images into the expanded ids and the
    model's tensors; `collapse` gives an engine back one image token per image."""

    image_token_id: int

    def process(self, images: list[Any]) -> dict[str, torch.Tensor]:
        """The processor's tensors for one row's images, each with the images (or their patches) on dim 0."""
        raise NotImplementedError

    def expand(self, ids: Sequence[int], inputs: dict[str, Any], where: str) -> list[int]:
        raise NotImplementedError

    def collapse(self, ids: Sequence[int]) -> list[int]:
        raise NotImplementedError

    def prepare(self, ids: Sequence[int], images: list[Any], where: str) -> tuple[list[int], dict[str, Any]]:
        """(expanded ids, model tensors) of one rendered row; a row without images is returned as it is."""
        if not images:
            return list(ids), {}
        inputs = self.process(images)
        return self.expand(ids, inputs, where), {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}

    def _count_check(self, found: int, images: int, where: str) -> None:
        if found != images:
            raise UserError(f"{where}: the chat template rendered {found} image tokens for {images} images; "
                            f"put one {PLACEHOLDER} per image and use the model's own chat template")


IMAGE_PROMPTS: Registry[type[ImagePrompt]] = Registry("image prompt family (processor class)")


@IMAGE_PROMPTS.register("Qwen2VLImageProcessor", "Qwen2VLImageProcessorPil", "Qwen2VLImageProcessorFast")
class QwenImagePrompt(ImagePrompt):
    """Qwen2-VL / Qwen2.5-VL: each `<|image_pad|>` becomes (t*h*w)/merge^2 pads, from the image's grid."""

    def __init__(self, tokenizer: Any, processor: Any) -> None:
        self.processor = processor
        self.tokens = VisionTokens.of(tokenizer, processor)
        self.image_token_id = self.tokens.image_token_id

    def process(self, images: list[Any]) -> dict[str, torch.Tensor]:
        return process_images(self.processor, images)

    def expand(self, ids: Sequence[int], inputs: dict[str, Any], where: str) -> list[int]:
        return self.tokens.expand(ids, inputs["image_grid_thw"], where)

    def collapse(self, ids: Sequence[int]) -> list[int]:
        """Each run of pads back to one pad (two images are never adjacent: vision start/end tokens frame each)."""
        pad = self.image_token_id
        return [t for i, t in enumerate(ids) if t != pad or i == 0 or ids[i - 1] != pad]


@IMAGE_PROMPTS.register("Idefics3Processor")
class Idefics3ImagePrompt(ImagePrompt):
    """Idefics3 (SmolVLM's architecture): each `<image>` becomes
    `<fake_token_around_image><global-img><image>*image_seq_len<fake_token_around_image>`, preceded by one such
    block per tile (`<row_i_col_j>` in place of `<global-img>`) when the image processor splits the image; the
    text is the processor's own (`replace_image_token`), tokenized alone, as vLLM's Idefics3 processor does."""

    def __init__(self, tokenizer: Any, processor: Any) -> None:
        self.processor = processor
        self.tokenizer = tokenizer
        self.image_token_id = int(processor.image_token_id)
        ids = tokenizer.convert_tokens_to_ids([processor.fake_image_token, processor.global_image_tag])
        if tokenizer.unk_token_id in ids or None in ids:
            raise UserError("the tokenizer lacks Idefics3's <fake_token_around_image>/<global-img> tokens; use the "
                            "model folder's own tokenizer (actor_rollout_ref.model.path)")
        self.fake_id, self.global_id = (int(i) for i in ids)

    def process(self, images: list[Any]) -> dict[str, torch.Tensor]:
        out = self.processor.image_processor(images=[images], return_tensors="pt", return_row_col_info=True)
        rows, cols = out["rows"][0], out["cols"][0]
        return {"pixel_values": out["pixel_values"][0], "pixel_attention_mask": out["pixel_attention_mask"][0],
                "rows": rows, "cols": cols}

    def expand(self, ids: Sequence[int], inputs: dict[str, Any], where: str) -> list[int]:
        layout = {"rows": [inputs["rows"]], "cols": [inputs["cols"]]}
        found = sum(1 for t in ids if t == self.image_token_id)
        self._count_check(found, len(inputs["rows"]), where)
        out: list[int] = []
        k = 0
        for tok in ids:
            if tok != self.image_token_id:
                out.append(tok)
                continue
            text = self.processor.replace_image_token(layout, k)
            out.extend(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            k += 1
        return out

    def collapse(self, ids: Sequence[int]) -> list[int]:
        """Each image's blocks, from its first `<fake_token_around_image>` to the one closing its global block,
        back to one `<image>`."""
        out: list[int] = []
        i, n = 0, len(ids)
        while i < n:
            if ids[i] != self.fake_id:
                out.append(ids[i])
                i += 1
                continue
            j = i
            while j < n and ids[j] != self.global_id:
                j += 1
            j += 1
            while j < n and ids[j] == self.image_token_id:
                j += 1
            if j >= n or ids[j] != self.fake_id:
                raise ValueError(f"token {i}: an Idefics3 image block without its closing global block")
            out.append(self.image_token_id)
            i = j + 1
        return out


def image_prompt(tokenizer: Any, processor: Any) -> ImagePrompt:
    """The family entry for `processor` (what `load_image_processor` returned for the model folder)."""
    name = type(processor).__name__
    if name not in IMAGE_PROMPTS:
        raise UserError(f"the model's processor {name} is of no vision-language family rlkit knows "
                        f"({', '.join(IMAGE_PROMPTS.names())}); use a Qwen2-VL/Qwen2.5-VL or Idefics3 (SmolVLM) "
                        "model, or register its family in rlkit.data.image_prompts.IMAGE_PROMPTS (docs/vlm.md)")
    return IMAGE_PROMPTS.get(name)(tokenizer, processor)
