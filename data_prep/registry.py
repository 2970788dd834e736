"""`DATASETS`: name -> Typer command. `rlkit data` adds one subcommand per entry.

A dataset module registers its command function; the function's signature (built
from `data_prep.options`) is the subcommand's options and its docstring the help.
`load_datasets()` imports every module of the package, so adding a dataset is
adding a file: no list to update anywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from rlkit.registry import Registry

DatasetCommand = Callable[..., None]
DATASETS: Registry[DatasetCommand] = Registry("dataset")


def load_datasets() -> Registry[DatasetCommand]:
    """Import all `data_prep` modules (registering their datasets) and return the registry."""
    import data_prep

    for info in pkgutil.iter_modules(data_prep.__path__):
        if not info.name.startswith("_") and not info.ispkg:
            importlib.import_module(f"data_prep.{info.name}")
    return DATASETS
