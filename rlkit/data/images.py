"""Images in RL prompts, as verl lays them out: a column (`data.image_key`, default `images`) holding a list per
row, each an encoded image (`{"bytes": ...}`, raw bytes) or a file (`{"path": ...}`, a path string), and one
`<image>` placeholder per image in the prompt text, in order.

A row's messages become typed content parts (`{"type": "image"}` / `{"type": "text"}`) that a VLM's chat
template renders as its vision tokens; the image processor turns the images into pixel patches and a grid per
image, and each image's single pad token is widened to the patches it merges into. Bad input fails at load
time with one line naming the file and row.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkit.errors import UserError

PLACEHOLDER = "<image>"
MODEL_INPUTS = "multi_modal_inputs"  # per-row non-tensor: the processor's tensors, what the trained model reads
ENGINE_INPUTS = "multi_modal_data"  # per-row non-tensor: {"image": [PIL images]}, what a rollout engine reads


def decode_image(item: Any, where: str, base_dir: str | None = None):
    """One cell entry -> an RGB PIL image. `where` names the file/row/column for the error line; relative paths
    are read from `base_dir` (the parquet's folder)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, Image.Image):
        return item.convert("RGB")
    if isinstance(item, Mapping):
        data, path = item.get("bytes"), item.get("path") or item.get("image")
    elif isinstance(item, (bytes, bytearray)):
        data, path = item, None
    elif isinstance(item, str):
        data, path = None, item
    else:
        raise UserError(f"{where}: an image must be {{'bytes': ...}}, {{'path': ...}} or a path string, got "
                        f"{type(item).__name__}; fix the row")
    if data is None:
        if not path:
            raise UserError(f"{where}: image has neither bytes nor a path; fix the row")
        full = path if os.path.isabs(path) or base_dir is None else os.path.join(base_dir, path)
        if not os.path.isfile(full):
            raise UserError(f"{where}: image file {full} not found; fix the path or put the file there")
        with open(full, "rb") as fh:
            data = fh.read()
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise UserError(f"{where}: image cannot be decoded ({type(exc).__name__}); store PNG/JPEG bytes or a "
                        "path to one") from None


def describe_images(cell: Any, where: str, base_dir: str | None = None) -> str:
    """A row's images in one line for `rlkit data inspect`: count and each one's size and format."""
    items = list(cell or [])
    sizes = []
    for k, item in enumerate(items):
        img = decode_image(item, f"{where} image {k}", base_dir)
        sizes.append(f"{img.width}x{img.height}")
    return f"{len(items)} image{'s' * (len(items) != 1)}" + (f": {', '.join(sizes)}" if sizes else "")


def with_image_parts(messages: list[dict[str, Any]], images: int, where: str) -> list[dict[str, Any]]:
    """The messages with each `<image>` placeholder split out as an `{"type": "image"}` part; the number of
    placeholders must equal the number of images."""
    found = sum(str(m.get("content") or "").count(PLACEHOLDER) for m in messages)
    if found != images:
        more = "more" if found > images else "fewer"
        raise UserError(f"{where}: {found} {PLACEHOLDER} placeholders in the prompt but {images} images ({more} "
                        f"placeholders than images); put one {PLACEHOLDER} per image, in order")
    out = []
    for msg in messages:
        content = msg.get("content")
        if not isinstance(content, str) or PLACEHOLDER not in content:
            out.append(msg)
            continue
        parts: list[dict[str, Any]] = []
        for i, text in enumerate(content.split(PLACEHOLDER)):
            if i:
                parts.append({"type": "image"})
            if text:
                parts.append({"type": "text", "text": text})
        out.append({**msg, "content": parts})
    return out


@dataclass(frozen=True)
class VisionTokens:
    """What widens a rendered prompt's image pads: the pad token id and the processor's merge size."""

    image_token_id: int
    merge_size: int

    @classmethod
    def of(cls, tokenizer: Any, image_processor: Any) -> VisionTokens:
        token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise UserError(f"the tokenizer has no image token {token!r}; use a vision-language model's folder "
                            "(actor_rollout_ref.model.path)")
        return cls(int(token_id), int(getattr(image_processor, "merge_size", 2)))

    def expand(self, ids: Sequence[int], grid_thw: Any, where: str) -> list[int]:
        """`ids` with the k-th image pad repeated as many times as image k has merged patches."""
        counts = [int(t * h * w) // self.merge_size**2 for t, h, w in grid_thw.tolist()]
        out: list[int] = []
        k = 0
        for tok in ids:
            if tok == self.image_token_id:
                if k >= len(counts):
                    raise UserError(f"{where}: the rendered prompt has more image tokens than images; "
                                    f"put one {PLACEHOLDER} per image and no image token in the text")
                out.extend([tok] * counts[k])
                k += 1
            else:
                out.append(tok)
        if k != len(counts):
            raise UserError(f"{where}: the chat template rendered {k} image tokens for {len(counts)} images; "
                            "use the model's own chat template (it renders image parts)")
        return out


def process_images(image_processor: Any, images: list[Any]) -> dict[str, Any]:
    """The processor's tensors for one row's images: `pixel_values` (patches, dim) and `image_grid_thw` (n, 3);
    empty for a row without images."""
    if not images:
        return {}
    out = image_processor(images=images, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
