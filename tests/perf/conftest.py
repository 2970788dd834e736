"""The toy task and tiny model fixtures of the trainer tests, shared here."""

from tests.trainer.conftest import tiny_model, toy_data  # noqa: F401 (pytest fixtures)
