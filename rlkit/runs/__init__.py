"""Watching runs: the status file a driver keeps (`status.py`), and what reads a run folder for `rlkit runs`, `rlkit
show` and `rlkit top` (its metrics, samples, workers) without ever touching the run itself.

A run folder is `trainer.default_local_dir`: the driver writes `status.json` there (pid, phase, step, total, state,
the log dir, the workers), next to the checkpoints; the metrics are `<log_dir>/metrics.jsonl` (the `file` tracker).
"""
