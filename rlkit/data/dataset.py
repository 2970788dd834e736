"""The RL prompt dataset: parquet rows in the common schema -> pre-tokenized chat prompts.

Everything expensive happens once, at load time: validation (so a bad file fails at
start-up, naming file/row/column), the chat template, tokenization and the
over-long policy. Fetching a batch afterwards only pads and indexes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlkit.data.collation import collate
from rlkit.data.image_prompts import image_prompt
from rlkit.data.images import ENGINE_INPUTS, MODEL_INPUTS, decode_image, with_image_parts
from rlkit.data.schema import data_columns, ensure_valid, read_table
from rlkit.data.truncation import TRUNCATION
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.utils.tokens import pad_token_id

logger = logging.getLogger(__name__)

PathLike = str | Path


def expand_files(files: PathLike | Sequence[PathLike]) -> list[Path]:
    """One path, a list of paths, or directories (all their *.parquet, sorted)."""
    items = [files] if isinstance(files, (str, Path)) else list(files)
    if not items:
        raise UserError("no data files given; pass at least one .parquet file (e.g. data.train_files)")
    out: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.parquet"))
            if not found:
                raise UserError(f"{path}: directory has no .parquet files; make some with `rlkit data gsm8k`")
            out.extend(found)
        else:
            out.append(path)
    return out


def _clean_message(msg: Mapping[str, Any]) -> dict[str, Any]:
    """Parquet gives every message all fields of the column's struct; drop the absent (None) ones."""
    return {k: v for k, v in msg.items() if v is not None or k in ("role", "content")}


class RLDataset:
    """Prompts from one or more parquet files, chat-templated and tokenized at load time.

    `truncation` says what to do with prompts over `max_prompt_length` tokens:
    "error" (UserError naming file and row), "left"/"right" (cut that side), "middle"
    (keep head and tail) or "filter" (drop them, logging how many). `filter_overlong_prompts`
    drops them first (verl's order), logging each file's kept/dropped counts, so `truncation`
    then sees none. `chat_template` overrides the tokenizer's; `chat_template_kwargs` go to
    `apply_chat_template` (e.g. {"enable_thinking": False}). `return_raw_chat=False` leaves the
    un-tokenized messages (`raw_prompt`) out of the rows.

    Images (rlkit/data/images.py): a row's `image_key` column (verl's `images`) lists its images and its prompt
    has one `<image>` per image; with an `image_processor` (the VLM's) each such row carries
    `multi_modal_data` ({"image": [PIL images]}, what the rollout engine reads) and `multi_modal_inputs`
    (the processor's tensors, e.g. `pixel_values`, `image_grid_thw`: what the trained model reads), and its ids
    hold each image's token widened as the model's family does it (rlkit/data/image_prompts.py). Rows without
    images carry empty ones.
    """

    def __init__(
        self,
        files: PathLike | Sequence[PathLike],
        tokenizer: Any,
        max_prompt_length: int = 1024,
        truncation: str = "error",
        prompt_key: str = "prompt",
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_samples: int | None = None,
        filter_overlong_prompts: bool = False,
        return_raw_chat: bool = True,
        image_key: str = "images",
        image_processor: Any = None,
    ) -> None:
        if max_prompt_length <= 0:
            raise UserError(f"max_prompt_length must be positive, got {max_prompt_length}")
        if max_samples is not None and max_samples <= 0:
            raise UserError(f"max_samples must be positive (or None for all rows), got {max_samples}")
        self.files = expand_files(files)
        self.tokenizer = tokenizer
        self.max_prompt_length = int(max_prompt_length)
        self.truncation = truncation
        self.prompt_key = prompt_key
        self._truncate = TRUNCATION.get(truncation)
        self.filter_overlong_prompts = filter_overlong_prompts
        self.return_raw_chat = return_raw_chat
        self._template_kwargs = dict(chat_template_kwargs or {})
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise UserError(
                f"tokenizer {name!r} has no chat template; use a chat/instruct model's tokenizer "
                "or pass a Jinja chat_template"
            )
        self.pad_token_id = pad_token_id(tokenizer)
        self.image_key = image_key
        self.image_processor = image_processor
        self._vision = image_prompt(tokenizer, image_processor) if image_processor is not None else None

        self._ids: list[np.ndarray] = []
        self._columns: dict[str, list[Any]] = {}
        self.num_filtered = 0  # by truncation=filter
        self.num_overlong_dropped = 0  # by filter_overlong_prompts
        self.num_truncated = 0
        seen = 0
        for path in self.files:
            if max_samples is not None and seen >= max_samples:
                break
            table = read_table(path)
            for warning in ensure_valid(table, path, prompt_key=prompt_key):
                logger.info("%s: %s", path, warning)
            if max_samples is not None:
                table = table.slice(0, max_samples - seen)
            self._load_table(table, path, offset=seen)
            seen += table.num_rows
        if self.num_filtered:
            logger.warning(
                "filtered %d of %d prompts longer than max_prompt_length=%d tokens (%s)",
                self.num_filtered, seen, self.max_prompt_length, ", ".join(str(f) for f in self.files),
            )  # fmt: skip
        if self.num_truncated:
            logger.warning(
                "cut %d prompts to max_prompt_length=%d tokens (truncation=%s)",
                self.num_truncated, self.max_prompt_length, truncation,
            )  # fmt: skip
        if not self._ids:
            raise UserError(
                f"no prompts left: all {seen} are longer than max_prompt_length={self.max_prompt_length}; "
                "raise max_prompt_length, or cut them instead "
                "(data.filter_overlong_prompts=false, truncation=left/right/middle)"
            )

    # ------------------------------------------------------------------ loading
    def _load_table(self, table: pa.Table, path: Path, offset: int) -> None:
        names = data_columns(table)
        messages = [[_clean_message(m) for m in row] for row in table.column(self.prompt_key).to_pylist()]
        images = self._images(table, path)
        if images is None:
            ids = self._tokenize(messages, path)
            vision: dict[str, list[Any]] = {}
        else:
            rendered = [with_image_parts(m, len(im), f"{path} row {r}, column '{self.prompt_key}'")
                        for r, (m, im) in enumerate(zip(messages, images, strict=True))]
            assert self._vision is not None
            prepared = [self._vision.prepare(seq, im, f"{path} row {r}")
                        for r, (seq, im) in enumerate(zip(self._tokenize(rendered, path), images, strict=True))]
            ids, inputs = [p[0] for p in prepared], [p[1] for p in prepared]
            vision = {ENGINE_INPUTS: [{"image": im} if im else {} for im in images], MODEL_INPUTS: inputs}
        keep: list[int] = []
        dropped = 0
        for row, seq in enumerate(ids):
            if len(seq) > self.max_prompt_length and self.filter_overlong_prompts:
                dropped += 1
                continue
            if len(seq) > self.max_prompt_length:
                cut = self._truncate(seq, self.max_prompt_length, f"{path} row {row}")
                if cut is None:
                    self.num_filtered += 1
                    continue
                self.num_truncated += 1
                seq = cut
            keep.append(row)
            self._ids.append(np.asarray(seq, dtype=np.int32))
        if self.filter_overlong_prompts:
            self.num_overlong_dropped += dropped
            logger.warning(
                "%s: filter_overlong_prompts kept %d rows, dropped %d with prompts over max_prompt_length=%d tokens",
                path, len(ids) - dropped, dropped, self.max_prompt_length,
            )  # fmt: skip

        extra_info = [e if e is not None else {} for e in table.column("extra_info").to_pylist()]
        fields: dict[str, list[Any]] = {
            **({"raw_prompt": messages} if self.return_raw_chat else {}),
            "data_source": table.column("data_source").to_pylist(),
            "reward_model": table.column("reward_model").to_pylist(),
            "extra_info": extra_info,
            "ability": table.column("ability").to_pylist(),
            "index": [_row_index(e, offset + i) for i, e in enumerate(extra_info)],
            **vision,
        }
        for name in names:  # other columns (e.g. tools_kwargs) pass through; built keys win on a clash
            if name not in (self.prompt_key, self.image_key) and name not in fields:
                fields[name] = table.column(name).to_pylist()
        # a column missing from some files is None on their rows
        before = len(self._ids) - len(keep)
        for key in [*fields, *(k for k in self._columns if k not in fields)]:
            column = self._columns.setdefault(key, [None] * before)
            values = fields.get(key)
            column.extend([values[r] for r in keep] if values is not None else [None] * len(keep))

    def _images(self, table: pa.Table, path: Path) -> list[list[Any]] | None:
        """Each row's decoded images (None: the file has no `image_key` column)."""
        if self.image_key not in table.column_names:
            return None
        if self.image_processor is None:
            raise UserError(f"{path}: column '{self.image_key}' holds images but the model has no image processor; "
                            "use a vision-language model (actor_rollout_ref.model.path) or drop the column")
        base = str(path.parent)
        rows = []
        for r, cell in enumerate(table.column(self.image_key).to_pylist()):
            where = f"{path} row {r}, column '{self.image_key}'"
            rows.append([decode_image(item, f"{where} image {k}", base) for k, item in enumerate(cell or [])])
        return rows

    def _tokenize(self, conversations: list[list[dict[str, Any]]], path: Path) -> list[list[int]]:
        texts = self._render(conversations, path)
        ids: list[list[int]] = []
        chunk = 8192  # bounds the tokenizer's peak memory on big files
        for start in range(0, len(texts), chunk):
            ids.extend(self.tokenizer(texts[start : start + chunk], add_special_tokens=False)["input_ids"])
        return ids

    def _render(self, conversations: list[list[dict[str, Any]]], path: Path) -> list[str]:
        kwargs = dict(add_generation_prompt=True, tokenize=False, chat_template=self.chat_template)
        kwargs.update(self._template_kwargs)
        if not conversations:
            return []
        try:
            return list(self.tokenizer.apply_chat_template(conversations, **kwargs))
        except Exception:  # find the row that breaks the template, for the message
            for row, conv in enumerate(conversations):
                try:
                    self.tokenizer.apply_chat_template(conv, **kwargs)
                except Exception as exc:
                    raise UserError(
                        f"{path} row {row}, column '{self.prompt_key}': the chat template failed ({exc}); "
                        "fix the messages or pass a chat_template that accepts them"
                    ) from None
            raise

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One row: `input_ids` (unpadded int32 array) and the raw fields."""
        row = {"input_ids": self._ids[i]}
        row.update({k: v[i] for k, v in self._columns.items()})
        return row

    @property
    def columns(self) -> list[str]:
        """The non-tensor fields of every row (raw_prompt, data_source, ... and passed-through columns)."""
        return list(self._columns)

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self._ids), dtype=np.int64, count=len(self._ids))

    def collate(self, rows: Sequence[Mapping[str, Any]]) -> Batch:
        return collate(rows, self.max_prompt_length, self.pad_token_id)

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """Rows at `indices` as a left-padded Batch (see `rlkit.data.collation`)."""
        idx = np.asarray(indices, dtype=np.int64)
        return self.collate([self[int(i)] for i in idx])


def _row_index(extra_info: Any, fallback: int) -> int:
    value = extra_info.get("index") if isinstance(extra_info, Mapping) else None
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else fallback
