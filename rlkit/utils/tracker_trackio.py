"""trackio as a tracker (`trainer.logger=[console,file,trackio]`): a local-first tracker whose runs live in a SQLite
file (`TRACKIO_DIR`, default `<log_dir>/trackio` here) and are browsed with `trackio show`.

Registered on import like the other backends; trackio is imported only when the tracker is built, and never
launches its dashboard from a training run (`embed=False`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from rlkit.utils.tracker_base import GENERATION_COLUMNS, TRACKERS, Generation, RunInfo, generation_rows, import_backend


@TRACKERS.register("trackio")
class TrackioTracker:
    """Project `trainer.project_name`, run `trainer.experiment_name`, the config; validation generations as a
    trackio Table per validation."""

    packages = ("trackio",)
    install = "pip install trackio"

    def __init__(self, run: RunInfo) -> None:
        os.environ.setdefault("TRACKIO_DIR", str(run.log_dir / "trackio"))  # read when trackio is imported
        trackio = import_backend("trackio", type(self))
        self._trackio = trackio
        self._run = trackio.init(project=run.project, name=run.experiment, config=run.config, embed=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def log_generations(self, samples: Sequence[Generation], step: int) -> None:
        table = self._trackio.Table(columns=list(GENERATION_COLUMNS),
                                    data=[list(r) for r in generation_rows(samples, step)])
        self._run.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self._run.finish()
