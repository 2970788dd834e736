"""A plugin estimator whose advantages turn NaN at the step named by $RLKIT_TEST_NAN_STEP (GRPO's otherwise): a NaN
that the driver's `--debug nan` check finds, so the pause opens pdb at the terminal. tests/trainer/
test_failure_drills.py trains with it (`trainer.plugins=[tests.trainer.nan_adv_plugin]`)."""

from __future__ import annotations

import os

from rlkit.algo import ADV_ESTIMATORS
from rlkit.algo.advantages import AdvantageInputs, grpo
from rlkit.algo.needs import needs
from rlkit.debug import current_step

ESTIMATOR = "test_grpo_nan_at_step"
STEP_ENV = "RLKIT_TEST_NAN_STEP"


@ADV_ESTIMATORS.register(ESTIMATOR)
@needs(groups=True)
def grpo_nan_at_step(inputs: AdvantageInputs):
    advantages, returns = grpo(inputs)
    if current_step() == int(os.environ.get(STEP_ENV, "0")):
        advantages = advantages * float("nan")
    return advantages, returns
