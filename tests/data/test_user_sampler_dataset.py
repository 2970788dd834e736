"""verl's data.sampler.class_path/class_name and data.custom_cls.path/name: the user's classes, loaded from a file or
a package as verl loads them and built with what verl passes, decide the training order and read the data; what is
missing is one line naming the key."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlkit.config.schema import DataConfig
from rlkit.data.sampler import RLDataLoader
from rlkit.data.user_dataset import UserDataset
from rlkit.data.user_sampler import UserSampler
from rlkit.errors import UserError
from rlkit.protocol import Batch
from rlkit.trainer.run.run_config import load_config

SAMPLER = textwrap.dedent("""
    class ReverseSampler:
        def __init__(self, data_source, data_config):
            self.n, self.seen, self.batch_size = len(data_source), [], data_config.train_batch_size
        def __iter__(self):
            return iter(range(self.n - 1, -1, -1))
        def __len__(self):
            return self.n
        def update(self, batch):
            self.seen.append(len(batch))
""")

DATASET = textwrap.dedent("""
    import torch
    class PaddedRows:
        def __init__(self, data_files, tokenizer, processor, config, max_samples):
            self.rows, self.width = [[5, 6], [7, 8, 9]], config.max_prompt_length
        def __len__(self):
            return len(self.rows)
        def __getitem__(self, i):
            ids = self.rows[i]
            pad = self.width - len(ids)
            mask = [0] * pad + [1] * len(ids)
            return {"input_ids": torch.tensor([0] * pad + ids), "attention_mask": torch.tensor(mask),
                    "position_ids": torch.zeros(self.width, dtype=torch.long), "data_source": "toy",
                    "raw_prompt": [{"role": "user", "content": str(i)}]}
""")


class Rows:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices) -> Batch:
        return Batch({"input_ids": torch.as_tensor(np.asarray(indices)).reshape(-1, 1)})


def test_the_users_sampler_orders_the_epoch_and_sees_each_step(tmp_path):
    (tmp_path / "my_sampler.py").write_text(SAMPLER)
    data = DataConfig(train_batch_size=2)
    sampler = UserSampler(str(tmp_path / "my_sampler.py"), "ReverseSampler", Rows(6), data)
    loader = RLDataLoader(Rows(6), 2, order_fn=sampler.order)
    firsts = [b["input_ids"].reshape(-1).tolist() for b in loader]
    assert firsts == [[5, 4], [3, 2], [1, 0]]
    sampler.update(Batch({"x": torch.zeros(3)}))
    assert sampler.sampler.seen == [3] and sampler.sampler.batch_size == 2  # verl's data_config reached it


def test_a_package_path_is_imported(tmp_path, monkeypatch):
    (tmp_path / "pkg_sampler.py").write_text(SAMPLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    sampler = UserSampler("pkg://pkg_sampler", "ReverseSampler", Rows(3), DataConfig())
    assert sampler.order(0).tolist() == [2, 1, 0]


def test_a_package_path_is_found_in_the_working_directory_as_python_m_finds_it(tmp_path, monkeypatch):
    """verl runs from its repository with `python -m`, so `pkg://` paths of its examples are relative to the working
    directory (e.g. `pkg://tests.utils.dataset...`); rlkit's console script looks there too."""
    package = tmp_path / "mysamplers" / "curriculum"
    package.mkdir(parents=True)
    (tmp_path / "mysamplers" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "reverse.py").write_text(SAMPLER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    sampler = UserSampler("pkg://mysamplers.curriculum.reverse", "ReverseSampler", Rows(3), DataConfig())
    assert sampler.order(0).tolist() == [2, 1, 0]


def test_the_preflight_imports_the_users_classes(tmp_path):
    from rlkit.trainer.run.preflight import Preflight, check_user_classes

    (tmp_path / "s.py").write_text(SAMPLER)
    cfg = load_config("grpo", ["actor_rollout_ref.rollout.name=hf", f"data.sampler.class_path={tmp_path / 's.py'}",
                               "data.sampler.class_name=ReverseSampler", "data.custom_cls.path=pkg://nowhere_x",
                               "data.custom_cls.name=D"])
    p = Preflight(cfg, allow_download=False)
    check_user_classes(p)
    assert p.problems == ["data.custom_cls: cannot import pkg://nowhere_x (No module named 'nowhere_x'); check the "
                          "module path"]


@pytest.mark.parametrize("path, name, words", [
    ("/no/such/file.py", "S", "data.sampler: no file /no/such/file.py"),
    ("pkg://no_such_module_here", "S", "data.sampler: cannot import pkg://no_such_module_here"),
    ("FILE", "Missing", "has no 'Missing'"),
])
def test_what_is_missing_is_one_line_naming_the_key(tmp_path, path, name, words):
    (tmp_path / "s.py").write_text(SAMPLER)
    with pytest.raises(UserError, match=words):
        UserSampler(str(tmp_path / "s.py") if path == "FILE" else path, name, Rows(3), DataConfig())


def test_the_users_dataset_rows_become_rlkits_batch(tmp_path):
    (tmp_path / "my_data.py").write_text(DATASET)
    data = DataConfig(max_prompt_length=4)
    data.custom_cls.path, data.custom_cls.name = str(tmp_path / "my_data.py"), "PaddedRows"
    ds = UserDataset(data, ["unused.parquet"], SimpleNamespace(pad_token_id=0), None, None)
    batch = ds.get_batch([1, 0])
    assert batch["input_ids"].tolist() == [[0, 7, 8, 9], [0, 0, 5, 6]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 1, 1]]
    assert list(batch["data_source"]) == ["toy", "toy"] and ds.columns == ["data_source", "raw_prompt"]


def test_the_config_reads_verls_keys():
    cfg = load_config("grpo", ["actor_rollout_ref.rollout.name=hf", "data.sampler.class_path=pkg://a.b",
                               "data.sampler.class_name=C", "data.custom_cls.path=/x/d.py", "data.custom_cls.name=D"])
    assert (cfg.data.sampler.class_path, cfg.data.sampler.class_name) == ("pkg://a.b", "C")
    assert (cfg.data.custom_cls.path, cfg.data.custom_cls.name) == ("/x/d.py", "D")
