"""The sandbox supervisor's processes: waiting for its children, and killing what the code left behind.

Loaded by path from `_sandbox_child.py` (stdlib only, never the tinyrl package). Without a PID
namespace nothing ends the code's processes for us: as root they all have the sandbox's own uid
(`reap_uid` kills every process of it); not root they have yours, so never by uid: the supervisor
is their subreaper (a daemonised grandchild is handed to it) and `kill_descendants` kills down its
own tree.
"""

import os
import signal
import time

REAPED: dict = {}  # pid -> wait status of the children already reaped while waiting for another


def wait(pid: int, wall_s: float) -> int:
    """Wait for `pid` up to `wall_s` (reaping any orphan handed to us); kill it at the deadline."""
    deadline = time.monotonic() + wall_s
    while True:
        if pid in REAPED:
            return REAPED.pop(pid)
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done == pid:
            return status
        if done:
            REAPED[done] = status  # the other child, or an orphan of the worker (we are PID 1 of the namespace)
            continue
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.005)


def reap_uid(uid: int) -> None:
    """Kill every process of the sandbox uid: fork, become that uid, kill(-1) until none is left."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            for _ in range(1000):
                os.kill(-1, signal.SIGKILL)  # as this uid: every process of the uid but ourselves
        except (ProcessLookupError, OSError):
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc/<p>/stat: the field after the name's closing parenthesis)."""
    kids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        kids.append(int(p))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def kill_descendants() -> None:
    """Kill every process below us, round by round: a killed process's children are handed to us (we are a
    subreaper), and are found in the next round; RLIMIT_NPROC bounds how many there can be."""
    for _ in range(200):
        kids = children(os.getpid())
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
