"""oneDNN's per-shape kernel caches are bounded in rlkit's worker processes (rlkit/utils/kernel_caches.py): a
worker sets the bounds at its start (a value the user set wins), and with them a process that meets 240 new bf16
matmul shapes keeps its heap and JIT code within a bound (by default it kept ~1 MB per shape: issue 44)."""

from __future__ import annotations

import json
import subprocess
import sys

from rlkit.controller.worker import Worker
from rlkit.utils.kernel_caches import KERNEL_CACHE_ENV

SHAPES = """
import ctypes, json, sys
sys.path.insert(0, "bench")
from rlkit.controller.worker import Worker
from soak import executable_anon_mb
import torch

Worker()  # a worker's start: sets the bounds before the first matmul
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo.restype = Info
torch.manual_seed(0)
a, b = torch.nn.Linear(256, 512, dtype=torch.bfloat16), torch.nn.Linear(512, 256, dtype=torch.bfloat16)
def sample():
    return {"heap_mb": mallinfo().uordblks / 2**20, "jit_mb": executable_anon_mb()}
for rows in range(8, 8 * 21, 8):  # warm-up: the first 20 shapes fill the bounded caches
    b(torch.relu(a(torch.randn(rows, 256, dtype=torch.bfloat16, requires_grad=True)))).sum().backward()
start = sample()
for rows in range(8 * 21, 8 * 241, 8):
    b(torch.relu(a(torch.randn(rows, 256, dtype=torch.bfloat16, requires_grad=True)))).sum().backward()
print(json.dumps({"start": start, "end": sample()}))
"""


def test_a_worker_bounds_the_caches_unless_the_user_set_them(monkeypatch):
    for name in KERNEL_CACHE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    Worker()
    import os

    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == KERNEL_CACHE_ENV["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_new_bf16_shapes_do_not_grow_a_worker_process():
    env = {k: v for k, v in __import__("os").environ.items() if k not in KERNEL_CACHE_ENV}
    out = subprocess.run([sys.executable, "-c", SHAPES], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    grown = {k: m["end"][k] - m["start"][k] for k in m["start"]}
    # by default the 220 new shapes kept ~3 MB each (heap + JIT code); bounded, the caches replace entries
    assert grown["jit_mb"] < 40 and grown["heap_mb"] < 80, m  # measured: +11 and +4 MB; unbounded +147, +550
