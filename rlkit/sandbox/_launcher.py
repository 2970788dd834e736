"""Sandbox launcher: runs as `python -I -S _launcher.py CONFIG_JSON` in a fresh session.

It is a separate single-threaded process so that the fiddly pre-exec steps
(namespaces, mounts, rlimits, dropping root) never run in a forked copy of the
multi-threaded trainer, where `preexec_fn` can deadlock. Stdlib only, no rlkit
imports. Every isolation step is best effort: what actually happened is sent
back on the status fd and measured by `sandbox_capabilities()`.

Process tree:  L (this, host namespaces) -> A (pid 1 of a new pid namespace,
reaper, reports status) -> B (the program: rlimits, unprivileged uid, exec).
Killing L's process group kills A, and A's exit kills everything in the
namespace, so nothing a program forks can outlive the run.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
# statvfs f_flag bits -> mount flags that must be kept on a remount (the kernel locks them in user namespaces)
_KEEP = {
    1: MS_RDONLY,
    2: MS_NOSUID,
    4: MS_NODEV,
    8: MS_NOEXEC,
    1024: MS_NOATIME,
    2048: MS_NODIRATIME,
    4096: MS_RELATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> None:
    if not hasattr(_libc, "unshare"):  # not Linux: no namespaces, the rlimits still apply
        raise OSError(38, "unshare is not available")
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None
    rc = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _kept_flags(path: str) -> int:
    f = os.statvfs(path).f_flag
    return sum(ms for st, ms in _KEEP.items() if f & st)


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            raw = line.split()[4]
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), raw))  # \040 -> space
    return points


def _enter_namespaces(done: dict) -> None:
    """New mount, network and pid namespaces; as non-root first a user namespace that maps us to root."""
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        try:
            _unshare(CLONE_NEWUSER)
            with open("/proc/self/setgroups", "w") as fh:
                fh.write("deny")
            with open("/proc/self/uid_map", "w") as fh:
                fh.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as fh:
                fh.write(f"0 {gid} 1")
            done["userns"] = True
        except OSError:
            return
    for name, flag in (("netns", CLONE_NEWNET), ("mountns", CLONE_NEWNS), ("pidns", CLONE_NEWPID)):
        try:
            _unshare(flag)
            done[name] = True
        except OSError:
            pass


def _blocked(paths: list[str]) -> dict[str, set[str]]:
    """Directories on the way to `paths` that others cannot traverse -> the children we need in them."""
    need: dict[str, set[str]] = {}
    for p in paths:
        parts = os.path.abspath(p).split("/")[1:]
        for i in range(len(parts)):
            parent = "/" + "/".join(parts[:i])
            try:
                traversable = os.stat(parent).st_mode & 0o001
            except OSError:
                break
            if not traversable:
                need.setdefault(parent, set()).add(parts[i])
    return need


def _expose(paths: list[str], done: dict) -> None:
    """Make `paths` reachable for an unprivileged uid without changing the host.

    A directory the uid cannot traverse (e.g. /root, 0700, holding the interpreter)
    is covered by a tmpfs that contains only bind mounts of the children we need,
    so the interpreter is visible and the rest of that directory is hidden.
    """
    need = _blocked(paths)
    for parent in sorted(need, key=len):
        fds = {c: os.open(os.path.join(parent, c), os.O_PATH) for c in need[parent]}
        _mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for child, fd in fds.items():
            target = os.path.join(parent, child)
            src = f"/proc/self/fd/{fd}"
            if os.path.isdir(src):
                os.mkdir(target)
            else:
                open(target, "w").close()
            _mount(src, target, None, MS_BIND | MS_REC)
            os.close(fd)
    done["exposed"] = sorted(need)


def _read_only_view(cfg: dict, done: dict) -> None:
    """Private mounts; scratch becomes a size-capped tmpfs; every other mount is remounted read-only."""
    work = cfg["work"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['scratch_bytes']},mode=700")
    done["scratch_tmpfs"] = True
    if cfg.get("uid") is not None:
        os.chown(work, cfg["uid"], cfg["uid"])
        _expose(cfg["expose"], done)
    failed = []
    for mp in _mount_points():
        if mp == work or not os.path.exists(mp):
            continue
        try:
            _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(mp))
        except OSError:
            failed.append(mp)
    done["readonly"] = not failed
    done["readonly_failed"] = failed
    if os.path.isdir("/dev/shm"):  # multiprocessing needs a writable /dev/shm; give it a small private one
        try:
            _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16m,mode=1777")
        except OSError:
            pass


def _exec_program(cfg: dict, status_fd: int) -> None:
    """Child B: limits, drop root, exec the program. Never returns."""
    try:
        os.set_inheritable(status_fd, False)
        lim = cfg["limits"]
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_s"], lim["cpu_s"] + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim["as_bytes"], lim["as_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize_bytes"], lim["fsize_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"]))
        uid = cfg.get("uid")
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(cfg["work"])
        os.execve(cfg["python"], [cfg["python"], *cfg["args"]], cfg["env"])
    except BaseException as exc:  # report and die; the parent classifies this as a runtime error
        os.write(2, f"sandbox launcher: cannot start the program: {exc!r}\n".encode())
    os._exit(127)


def _reaper(cfg: dict, status_fd: int, done: dict) -> None:
    """Process A: (pid 1 of the new pid namespace) start B, reap everything, report B's status."""
    if done.get("pidns") and done.get("mountns"):
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
            done["private_proc"] = True
        except OSError:
            pass
    pid = os.fork()
    if pid == 0:
        _exec_program(cfg, status_fd)
    if hasattr(_libc, "prctl"):  # PR_SET_DUMPABLE=0: the program (same uid without a uid drop) cannot ptrace us
        _libc.prctl(4, 0, 0, 0, 0)
    while True:
        got, status, usage = os.wait4(-1, 0)
        if got == pid:
            break
    report = {
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_kb": usage.ru_maxrss,
        "enforced": done,
    }
    os.write(status_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    status_fd = cfg["status_fd"]
    done: dict = {"uid": None}
    drop_root = cfg.get("uid") is not None and os.geteuid() == 0
    if drop_root:  # the program runs as an unprivileged uid that owns its job dir and nothing else
        os.chown(cfg["job"], cfg["uid"], cfg["uid"])
        os.chown(cfg["work"], cfg["uid"], cfg["uid"])
    else:
        cfg["uid"] = None
    if cfg.get("isolate", True):
        _enter_namespaces(done)
        if done.get("mountns"):
            try:
                _read_only_view(cfg, done)
            except OSError as exc:
                done["mount_error"] = str(exc)
    if cfg["uid"] is not None and "exposed" not in done and _blocked(cfg["expose"]):
        cfg["uid"] = None  # the interpreter is unreachable for another uid and we could not expose it: stay root
    done["uid"] = cfg["uid"]
    pid = os.fork()
    if pid == 0:
        _reaper(cfg, status_fd, done)
    os.close(status_fd)
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
