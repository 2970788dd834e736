"""verl's `data.sampler` and `data.custom_cls` sections: a user's sampler or dataset class, named as verl names it
(`pkg://module` or a .py file, and the class name); rlkit.data.user_sampler / user_dataset build them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplerClassConfig:
    class_path: str | None = field(default=None, metadata={"help": "pkg://dotted.module (the working directory first, "
                                   "as `python -m` finds it) or a .py file holding the training sampler class; null = "
                                   "rlkit's seeded order (data.shuffle)"})
    class_name: str | None = field(default=None, metadata={"help": "the sampler class: built as cls(data_source="
                                   "dataset, data_config=data); an update(batch) method is called after each step"})


@dataclass
class DatasetClassConfig:
    path: str | None = field(default=None, metadata={"help": "pkg://dotted.module or a .py file holding a dataset "
                             "class that reads the data files instead of rlkit's; null = rlkit's"})
    name: str | None = field(default=None, metadata={"help": "the dataset class: built as cls(data_files=, "
                             "tokenizer=, processor=, config=data, max_samples=); rows in verl's format"})
