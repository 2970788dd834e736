"""verl's `data.custom_cls.path` / `name`: the user's dataset class reads the data files instead of rlkit's RLDataset.

As verl builds it: `cls(data_files=, tokenizer=, processor=, config=<the data section as an OmegaConf mapping>,
max_samples=)`, for the training and the validation files. Its rows are verl's: `input_ids` (the prompt, padded or
not, with its `attention_mask`) and the raw fields (`raw_prompt`, `data_source`, `reward_model`, `extra_info`...),
which become rlkit's left-padded Batch; the tensors verl's trainer recomputes (`position_ids`, ...) are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlkit.data.collation import TENSOR_KEY, collate
from rlkit.data.dataset import RLDataset
from rlkit.data.user_classes import load_user_object
from rlkit.errors import UserError
from rlkit.protocol import Batch

KEY = "data.custom_cls"
#: what a verl dataset row holds that rlkit's collation rebuilds (or does not read)
REBUILT = ("attention_mask", "position_ids", "raw_prompt_ids")


class UserDataset:
    """The user's dataset as rlkit's loader reads it: `len`, `columns`, `get_batch(indices)`."""

    def __init__(self, data: Any, files: Any, tokenizer: Any, processor: Any, max_samples: int | None) -> None:
        from omegaconf import OmegaConf

        cls = load_user_object(data.custom_cls.path, data.custom_cls.name, KEY)
        section = OmegaConf.create(dataclasses.asdict(data))
        try:
            self.dataset = cls(data_files=files, tokenizer=tokenizer, processor=processor, config=section,
                               max_samples=-1 if max_samples is None else max_samples)
        except TypeError as exc:
            raise UserError(f"{KEY}.name={data.custom_cls.name}: verl builds it as cls(data_files=, tokenizer=, "
                            f"processor=, config=, max_samples=), which it does not take ({exc})") from None
        self.max_prompt_length, self.pad_token_id = data.max_prompt_length, tokenizer.pad_token_id

    def __len__(self) -> int:
        return len(self.dataset)

    def row(self, i: int) -> dict[str, Any]:
        item = self.dataset[int(i)]
        if not isinstance(item, Mapping) or TENSOR_KEY not in item:
            raise UserError(f"{KEY}: row {i} of the dataset is not a mapping with input_ids (verl's row format)")
        ids = torch.as_tensor(item[TENSOR_KEY]).reshape(-1)
        if "attention_mask" in item:  # verl pads the prompt; rlkit pads it again, so only the real tokens move
            ids = ids[torch.as_tensor(item["attention_mask"]).reshape(-1).bool()]
        row = {k: v for k, v in item.items() if k not in REBUILT and k != TENSOR_KEY}
        return {TENSOR_KEY: ids.numpy().astype(np.int64), **row}

    @property
    def columns(self) -> list[str]:
        return [k for k in self.row(0) if k != TENSOR_KEY] if len(self) else []

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        return collate([self.row(int(i)) for i in np.asarray(indices)], self.max_prompt_length, self.pad_token_id)


def rl_dataset_keys(data: Any, image_processor: Any) -> dict[str, Any]:
    """RLDataset's keywords from the `data` section, one place for the run and its pre-flight."""
    return dict(filter_overlong_prompts=data.filter_overlong_prompts, return_raw_chat=data.return_raw_chat,
                image_key=data.image_key, image_processor=image_processor,
                chat_template_kwargs=dict(data.apply_chat_template_kwargs))


def dataset_maker(data: Any, tokenizer: Any, processor: Any, **rl_keys: Any) -> Callable[[Any, Any], Any]:
    """(files, max_samples) -> the dataset: the user's class when data.custom_cls.path is set, else RLDataset."""
    if data.custom_cls.path:
        return lambda files, max_samples: UserDataset(data, files, tokenizer, processor, max_samples)
    return lambda files, max_samples: RLDataset(files, tokenizer, data.max_prompt_length, data.truncation,
                                                data.prompt_key, max_samples=max_samples, **rl_keys)
