"""What the sandbox actually enforces on this machine, measured by running a probe program in it.

Every isolation step of the launcher is best effort (namespaces need privileges the host may not grant);
`sandbox_capabilities()` says which held here, for `rlkit reward check` and the tests.
"""

from __future__ import annotations

import functools
import json
import os
import resource
from dataclasses import replace

from rlkit.sandbox.process import SandboxLimits, run_program

_PROBE = r"""
import json, os, resource, socket, sys
out = {"uid": os.getuid(), "pid": os.getpid(), "cwd": os.getcwd(), "home": os.environ.get("HOME")}
try:
    os.makedirs(os.path.join(os.path.dirname(os.getcwd()), "outside"))
    out["write_outside"] = True
except OSError:
    out["write_outside"] = False
try:
    out["net_ifaces"] = sorted(os.listdir("/sys/class/net"))
except OSError:
    out["net_ifaces"] = None
s = socket.socket()
s.settimeout(0.5)
try:
    s.connect(("127.0.0.1", int(sys.stdin.read() or 9)))
    out["loopback_connect"] = True
except OSError:
    out["loopback_connect"] = False
out["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=1)
def sandbox_capabilities() -> dict:
    """Measure once what the sandbox enforces on this machine (runs a probe program)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        res = run_program(_PROBE, stdin=str(port), limits=replace(SandboxLimits(), wall_s=10.0))
    finally:
        server.close()
    caps = {
        "subprocess": True,
        "wall_timeout": True,
        "output_cap": True,
        "rlimit_cpu": True,
        "rlimit_as": True,
        "rlimit_fsize": True,
        "env_stripped": True,
        "scratch_cwd_home": False,
        "network_isolated": False,
        "readonly_fs": False,
        "scratch_tmpfs": False,
        "pid_namespace": False,
        "unprivileged_uid": False,
        "nproc_limit": False,
        "probe_status": res.status,
    }
    try:
        seen = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        caps["probe_error"] = res.stderr[-500:]
        return caps
    enforced = res.enforced
    caps["scratch_cwd_home"] = seen["cwd"] == seen["home"]
    caps["network_isolated"] = not seen["loopback_connect"] and bool(enforced.get("netns"))
    caps["readonly_fs"] = not seen["write_outside"]
    caps["scratch_tmpfs"] = bool(enforced.get("scratch_tmpfs"))
    caps["pid_namespace"] = seen["pid"] <= 2
    # in a user namespace the program sees uid 0, but on the host it is our own non-root uid
    caps["unprivileged_uid"] = seen["uid"] != 0 or (bool(enforced.get("userns")) and os.geteuid() != 0)
    caps["nproc_limit"] = seen["uid"] != 0 and seen["nproc"] != resource.RLIM_INFINITY
    caps["user_namespace"] = bool(enforced.get("userns"))
    return caps
