"""Stop at the first NaN/Inf (`--debug nan`, `trainer.debug.detect_anomaly=true`).

A non-finite loss, gradient, log-prob, advantage or reward is found where it first appears: the worker's update
loop checks each micro-batch's loss and, after its backward, the gradients (the parameter nearest the loss that
went non-finite is named); the log-prob passes check their output; the driver checks the rewards and the
advantages of the step. Then, by `RLKIT_DETECT_ANOMALY`:

- "pause" (an interactive `--debug nan` run): the process stops in `breakpoint()` inside `pause_here`, with
  `what`, `where`, `rows` (the micro-batch), `sample_ids` and `value` in scope, for the debugger
  (`rlkit debug attach` / VS Code in a Ray worker, pdb in the driver); continuing stops the run as below.
With several data-parallel ranks FSDP's gradient reduce-scatter spreads one rank's NaN to every rank; the rank
whose own backward made it (a hook on the log-probs' gradient, `watch_gradient`) reports, the others wait.

- "stop" (a log file, CI, or the config key alone): the rows are written to
  `<log dir>/anomalies/step<N>_rank<R>_<what>.pt` and `NonFiniteValue` stops the run with one line naming the
  value, the place, the file and the `rlkit debug replay` command.

Off (the variable unset) every check is one dictionary lookup: `anomaly_mode()` is read once per process.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.debug.breakpoints import current_rank, current_step

if TYPE_CHECKING:
    import torch

ANOMALY_ENV = "RLKIT_DETECT_ANOMALY"  # "pause" | "stop"; unset: off
ANOMALY_DIR_ENV = "RLKIT_ANOMALY_DIR"  # where the rows go (the run's log dir + /anomalies)
ANOMALY_RUN_ENV = "RLKIT_ANOMALY_RUN"  # the run's checkpoint folder, for the replay command
MODES = ("pause", "stop")
SAMPLE_ID_KEYS = ("index", "uid")  # non-tensor columns that name a row (dataset index, prompt uid)
LINE_PREFIX = "non-finite "  # how the driver finds the one line in a worker's traceback


class NonFiniteValue(RuntimeError):
    """A NaN/Inf was found; the message is the one line the user sees."""


@functools.cache
def anomaly_mode() -> str | None:
    """"pause", "stop" or None (off), from the environment the run gave this process."""
    mode = os.environ.get(ANOMALY_ENV, "").strip()
    return mode if mode in MODES else None


def anomaly_env(pause: bool, log_dir: str, run_dir: str) -> dict[str, str]:
    """The variables a run sets in the driver and every worker to turn the checks on."""
    return {ANOMALY_ENV: "pause" if pause else "stop", ANOMALY_DIR_ENV: str(Path(log_dir) / "anomalies"),
            ANOMALY_RUN_ENV: run_dir}


def check_tensor(what: str, value: torch.Tensor, rows: Any = None, where: str = "") -> None:
    """`value` (a loss, log-probs, advantages, rewards) must be finite; `rows`: the batch it came from."""
    if anomaly_mode() is None:
        return
    import torch

    finite = torch.isfinite(value.detach())
    if not bool(finite.all()):
        bad = int((~finite).sum())
        found(what, f"{where}{' ' if where else ''}({bad} of {finite.numel()} values)", rows, value)


_local_origin: list[Any] = []  # the rows whose backward sent a non-finite gradient into this rank's model


def watch_gradient(value: torch.Tensor, rows: Any) -> None:
    """Remember `rows` if the gradient reaching `value` (a model output) in backward is non-finite: the NaN then
    starts here, on this rank, whatever the other ranks' gradients show after FSDP reduces them."""
    if anomaly_mode() is None or not value.requires_grad:
        return
    import torch

    def hook(grad: torch.Tensor) -> None:
        if not _local_origin and not bool(torch.isfinite(grad).all()):
            _local_origin.append(rows)

    value.register_hook(hook)


def check_gradients(module: torch.nn.Module, rows: Any = None, where: str = "") -> None:
    """Every gradient of `module` must be finite after a backward; names the parameter nearest the loss (the
    last in module order, where backward starts) and counts the others."""
    if anomaly_mode() is None:
        return
    import torch

    named = [(name, _local(p.grad)) for name, p in module.named_parameters() if p.grad is not None]
    if not named:
        return
    finite = torch.stack([torch.isfinite(g).all() for _, g in named])  # one device sync for all of them
    if bool(finite.all()):
        return
    bad = [name for (name, _), ok in zip(named, finite.tolist()) if not ok]
    if not _starts_here():
        _wait_for_the_origin()
    rows = _local_origin[0] if _local_origin else rows
    first = _clean_name(bad[-1])
    more = f" and {len(bad) - 1} more parameters" if len(bad) > 1 else ""
    found("gradient", f"{where}{' ' if where else ''}of {first}{more}", rows, None)


def _starts_here() -> bool:
    """Whether this rank reports a non-finite gradient every rank now sees: it made it, or no rank's hook saw
    where it came from (then every rank reports). All ranks get here together (the reduce spread the NaN)."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    flag = torch.tensor([1.0 if _local_origin else 0.0])
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(_local_origin) or float(flag) == 0.0


def _wait_for_the_origin() -> None:
    """A peer made the NaN and reports it (or pauses for the debugger): wait while it does; in a stopping run the
    driver stops this worker once the peer's error arrives, and this rank then says so itself."""
    import time

    time.sleep(3600 if anomaly_mode() == "pause" else 30)
    raise NonFiniteValue("non-finite gradient from another rank (its report comes first)")


def _local(grad: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) gradient: checked where it lives, no collective."""
    return grad.to_local() if hasattr(grad, "to_local") else grad


def _clean_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (FSDP, activation checkpointing, torch.compile)."""
    return re.sub(r"(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\.", "", name)


def sample_ids(rows: Any) -> list[Any]:
    """The rows' sample ids: `uid` (one per prompt) with the dataset `index` when the batch has them."""
    non_tensors = getattr(rows, "non_tensors", {}) or {}
    for key in SAMPLE_ID_KEYS:
        if key in non_tensors:
            return list(non_tensors[key])
    return list(range(len(rows))) if rows is not None else []


def found(what: str, where: str, rows: Any, value: Any) -> None:
    """A non-finite `what` at `where`: pause for the debugger or save the rows; then stop the run."""
    step, rank = current_step(), current_rank()
    path = save_rows(rows, step, rank, what)
    line = stop_line(what, where, step, rank, path, rows)
    if anomaly_mode() == "pause":
        pause_here(what, where, rows, value, line)
    raise NonFiniteValue(line)


def pause_here(what: str, where: str, rows: Any, value: Any, line: str) -> None:
    """Where a debugger stops: `what`, `where`, `rows` (the micro-batch), `sample_ids`, `value` are in scope."""
    import sys

    ids = sample_ids(rows)  # noqa: F841 (in scope for the debugger)
    print(f"[rlkit.debug] {line}; paused for the debugger (continue to stop the run)", file=sys.stderr, flush=True)
    breakpoint()  # --debug nan: look at rows, ids, value; continue (c) stops the run


def save_rows(rows: Any, step: int | None, rank: int, what: str) -> Path | None:
    """The micro-batch as `<anomaly dir>/step<N>_rank<R>_<what>.pt` (a Batch, torch.load(weights_only=False))."""
    folder = os.environ.get(ANOMALY_DIR_ENV)
    if rows is None or not folder:
        return None
    import torch

    path = Path(folder) / f"step{step if step is not None else 0}_rank{rank}_{what.replace(' ', '_')}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rows, path)
    return path


def stop_line(what: str, where: str, step: int | None, rank: int, path: Path | None, rows: Any) -> str:
    ids = sample_ids(rows)
    shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
    text = f"{LINE_PREFIX}{what} {where} at step {step}, rank {rank}"
    if rows is not None:
        text += f"; {len(rows)} rows (sample ids {shown})"
    if path is not None:
        text += f" saved to {path}"
    run = os.environ.get(ANOMALY_RUN_ENV)
    if run and step is not None:
        text += f"; replay the step with: rlkit debug replay {run} --step {step}"
    return text


def line_in(text: str) -> str | None:
    """The one line of a NonFiniteValue inside a worker's traceback text, if there is one."""
    for line in reversed(text.splitlines()):
        at = line.find(LINE_PREFIX)
        if at >= 0 and "NonFiniteValue" in line:
            return line[at:].strip()
    return None
