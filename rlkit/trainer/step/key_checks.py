"""`--debug`'s batch-key contract check: every worker call's returned Batch against rlkit/batch_keys.py.

`CheckedView` stands in for a role's `WorkerGroupView` and checks what a blocking call returned (a
non-blocking call's future is checked when the trainer reads it: not here). The cost is a dict walk per
call, so it is off unless asked for (`--debug`, or `trainer.debug.check_batch_keys=true`).
"""

from __future__ import annotations

from typing import Any

from rlkit.batch_keys import CALL_OUTPUTS, check_output
from rlkit.phases import call_roles

ROLES = call_roles()  # every role a phase calls (rlkit/phases.py)


class CheckedView:
    """A role view whose calls in `CALL_OUTPUTS` have their output checked against the declared keys."""

    def __init__(self, view: Any, role: str) -> None:
        self._view, self._role = view, role

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._view, name)
        if name not in CALL_OUTPUTS or not callable(attr):
            return attr

        def checked(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            if not hasattr(out, "tensors"):
                return out  # a future (non-blocking call)
            batch = args[0] if args else kwargs.get("batch")
            rows = len(batch) if batch is not None else len(out)
            responses = getattr(batch, "tensors", {}).get("responses")
            check_output(self._role, name, out, rows, None if responses is None else responses.shape[1])
            return out

        return checked


def check_batch_keys(workers: Any) -> None:
    """Wrap each role view of `workers` (a WorkerHandles) in a `CheckedView`, in place."""
    for role in ROLES:
        view = workers.views.get(role)
        if view is not None and not isinstance(view, CheckedView):
            workers.views[role] = CheckedView(view, role)
