"""A small process pool whose calls have a wall-clock timeout that really stops them.

Verifiers can hang (sympy on an adversarial expression, a regex blow-up). math-verify's own
timeouts use `signal.alarm`, which only works on the main thread and breaks off whatever
that thread was doing; so tinyrl turns them off and runs the verifier here instead: in
worker processes started from a standalone script (`_worker.py`, which never imports
tinyrl or torch). A call that runs past `timeout` gets its worker killed and replaced, and
comes back as `TIMEOUT`; the caller scores it None (excluded), and the run goes on.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Pipe, wait
from pathlib import Path

WORKER_SCRIPT = str(Path(__file__).with_name("_worker.py"))
# `-c` puts the current directory first on sys.path; drop it so a stray math.py there cannot shadow anything.
_BOOT = "import runpy, sys; sys.path.pop(0); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


class _Timeout:
    def __repr__(self) -> str:
        return "TIMEOUT"


TIMEOUT = _Timeout()  # the value of a call that ran past its timeout


@dataclass
class CallError:
    message: str  # "ExceptionType: text" from the worker, or why the worker died


class _Worker:
    def __init__(self, warm: str | None):
        parent, child = Pipe(duplex=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, WORKER_SCRIPT, str(child.fileno())],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, close_fds=True,
        )
        child.close()
        self.conn = parent
        # The first call (index -1) waits for the interpreter to start and runs the warm-up:
        # a per-call timeout must not count start-up time, which can be seconds on a busy box.
        self.conn.send((-1, warm or "ready", ()))
        self.task: tuple[int, float] | None = (-1, time.monotonic() + 120.0)  # (index, deadline) in flight

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        self.conn.close()


class TimeoutPool:
    """`workers` processes; `map(ref, args_list, timeout)` -> one result per args tuple.

    `ref` is "module:function" (importable in the worker) or the name of a function in
    `_worker.py`. A result is the function's return value, `TIMEOUT`, or a `CallError`.

    >>> pool = TimeoutPool(workers=1)
    >>> pool.map("time:sleep", [(0,), (30,)], timeout=1.0)
    [None, TIMEOUT]
    >>> pool.close()
    """

    def __init__(self, workers: int = 2, warm: str | None = None):
        self.size = max(1, workers)
        self.warm = warm
        self.pid = os.getpid()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.timeouts = 0  # calls cut off so far
        atexit.register(self.close)

    def map(self, ref: str, args_list: list[tuple], timeout: float = 5.0) -> list:
        with self._lock:
            return self._map(ref, args_list, timeout)

    def _map(self, ref, args_list, timeout):
        while len(self._workers) < min(self.size, max(1, len(args_list))):
            self._workers.append(_Worker(self.warm))
        results: list = [None] * len(args_list)
        todo = list(range(len(args_list)))[::-1]
        left = len(args_list)
        while left:
            for w in self._workers:
                if w.task is None and todo:
                    i = todo.pop()
                    w.conn.send((i, ref, tuple(args_list[i])))
                    w.task = (i, time.monotonic() + timeout)
            busy = [w for w in self._workers if w.task is not None]
            next_deadline = min(w.task[1] for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            now = time.monotonic()
            for k, w in enumerate(list(self._workers)):
                if w.task is None:
                    continue
                i, deadline = w.task
                if w.conn in ready:
                    try:
                        _, ok, value = w.conn.recv()
                    except (EOFError, OSError):
                        ok, value = False, "the worker process died"
                        self._replace(k, w)
                    else:
                        w.task = None
                    if i >= 0:  # i < 0: the warm-up call
                        results[i] = value if ok else CallError(value)
                        left -= 1
                elif now >= deadline:
                    if i >= 0:
                        results[i] = TIMEOUT
                        left -= 1
                        self.timeouts += 1
                    self._replace(k, w)
        return results

    def _replace(self, k: int, w: _Worker) -> None:
        w.kill()
        self._workers[k] = _Worker(self.warm)

    def close(self) -> None:
        if os.getpid() != self.pid:  # a forked copy: the workers belong to the parent
            return
        for w in self._workers:
            try:
                w.conn.send(None)
            except Exception:
                pass
            w.kill()
        self._workers = []


_POOLS: dict[str, TimeoutPool] = {}


def shared_pool(name: str, workers: int | None = None, warm: str | None = None) -> TimeoutPool:
    """One process-wide pool per `name` (recreated after a fork)."""
    pool = _POOLS.get(name)
    if pool is None or pool.pid != os.getpid():
        workers = workers or min(2, os.cpu_count() or 1)
        pool = _POOLS[name] = TimeoutPool(workers=workers, warm=warm)
    return pool
