"""The NaN case of tests/debug/test_debug_nan.py: the plugin loss's name, the step and the rank where its gradient
turns NaN. Kept apart from nan_plugin.py, whose import registers the loss: collecting the test must not (the
registry-name tests of the other files share the process)."""

LOSS, STEP, RANK = "test_nan_grad_at_step_3", 3, 1
