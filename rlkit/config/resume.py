"""verl's `trainer.resume_mode=resume_path` + `trainer.resume_from_path`, read as verl reads them: the path is used
only in that mode (auto and disable ignore it, as verl's trainer does), and a folder that does not exist yet (a
script's first run) starts fresh. rlkit's own spelling, `resume_mode=<path>`, is unchanged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rlkit.errors import UserError

log = logging.getLogger("rlkit.config")  # where the verl-key lines go (rlkit.config.load)


def settle_resume(trainer) -> None:
    path = trainer.resume_from_path
    if str(trainer.resume_mode) != "resume_path":
        if path:
            log.warning("verl key trainer.resume_from_path=%s -> nothing to set: read only with "
                        "trainer.resume_mode=resume_path (resume_mode=%s, as in verl)", path, trainer.resume_mode)
        return
    if not path:
        raise UserError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<a global_step_N folder>")
    if not Path(os.path.expanduser(str(path))).exists():
        log.warning("verl key trainer.resume_from_path=%s -> it does not exist yet: the run starts fresh "
                    "(trainer.resume_mode=disable), as verl does", path)
        trainer.resume_mode = "disable"
        return
    trainer.resume_mode = str(path)
