"""Fixtures shared with the trainer tests: the toy copy-task data set (an actor update needs its config)."""

from tests.trainer.conftest import toy_data  # noqa: F401  (re-exported fixture)
