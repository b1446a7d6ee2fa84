"""The process the run's reward functions are called in, so that no reward can take the trainer down.

`RewardProcess(fns, call)` forks this process once, at its first call (and again only after the
previous one died or was stopped), and keeps the child for the run: no fork per call. The child
inherits the reward functions as they are, so any callable works (closures, partials, bound
methods, lambdas: nothing is pickled but the batch's inputs and the scores), and a reward keeps its
own state (a cache) from call to call within the child.

What reaches the trainer is `call(fn, kwargs, n)`'s return value, or:

- the child ended inside a call (`os._exit`, a segfault in a native extension, the kernel's OOM
  killer): "error", naming how it ended; the next call forks a fresh child;
- it ran past `timeout`: its threads' Python stacks go to stderr (where a slow reward spent its time), then
  it is killed (a real kill, unlike a thread) and "timeout";
- a runaway allocation: the child's address space is capped at what it had when forked plus
  `MEMORY_SHARE` of the machine's RAM (a MemoryError in the reward, an "error"), and its
  oom_score_adj is 1000, so that the kernel's OOM killer, if it must act, takes the child first.

The child ignores Ctrl-C and SIGTERM (the trainer decides when to stop; a first Ctrl-C lets the
step finish) and dies with the trainer (PR_SET_PDEATHSIG, and the end of its pipe). It cannot use a
CUDA context the trainer made (CUDA does not survive a fork): a reward that runs a model on the card
needs `reward.isolate: false`. Linux and other systems with os.fork only; elsewhere, in-process.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import resource
import signal
import sys
import time
import weakref
from multiprocessing.connection import Pipe
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from tinyrl.hardware import host_memory

MEMORY_SHARE = 0.5  # of the machine's RAM: what the child may allocate beyond what it inherited
PR_SET_PDEATHSIG = 1
CAN_FORK = hasattr(os, "fork")
DUMP_SIGNAL = getattr(signal, "SIGUSR1", None)  # a child past its timeout writes its threads' stacks on this
STDERR_FD = 2
DUMP_WAIT_S = 0.5  # how long the parent waits for that dump before the kill (a C handler: no Python to wait on)
try:  # resolved here, in the parent: dlopen in a child forked from a threaded process can wait on a lock forever
    _PRCTL = ctypes.CDLL(None).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _child_setup() -> None:
    """In the fresh child: signals, death with the parent, the memory cap, first in line for the OOM killer."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    faulthandler.disable()  # a crash here is the reward's, reported by name: no trainer-looking dump on the terminal
    if DUMP_SIGNAL is not None:  # ... but a call past its timeout shows where it stood (`RewardProcess.run`)
        # on file descriptor 2, not sys.stderr: under pytest's capture or a notebook, sys.stderr has no descriptor
        faulthandler.register(DUMP_SIGNAL, file=STDERR_FD, all_threads=True)
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    size = _vm_size()
    if size:
        cap = size + int(MEMORY_SHARE * host_memory())
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard if hard != resource.RLIM_INFINITY else cap))
    torch = sys.modules.get("torch")
    if torch is not None:  # as torch's DataLoader workers: one intra-op thread (OpenMP pools do not survive a fork)
        torch.set_num_threads(1)


def _serve(conn, fns: list, call: Callable) -> None:
    """The child's loop: (index, kwargs, n) in, call(fns[index], kwargs, n)'s reply out, until the pipe closes."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        k, kwargs, n = msg
        conn.send(call(fns[k], kwargs, n))


def describe_exit(status: int) -> str:
    """A waitpid status in words: how the reward's process ended.

    >>> describe_exit(3 << 8), describe_exit(signal.SIGSEGV)
    ('it exited with status 3 (os._exit or sys.exit in native code?)', 'it was killed by SIGSEGV (a crash in native code?)')
    """
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"it exited with status {code} (os._exit or sys.exit in native code?)"
    name = signal.Signals(-code).name
    why = {"SIGSEGV": "a crash in native code?", "SIGBUS": "a crash in native code?", "SIGABRT": "an abort in native code?",
           "SIGKILL": "the kernel's OOM killer?"}.get(name, "a signal")
    return f"it was killed by {name} ({why})"


class RewardProcess:
    """The child that calls `fns`; `call(fn, kwargs, n)` runs there and must return something picklable."""

    def __init__(self, fns: list, call: Callable):
        self.fns, self._call = fns, call
        self.pid: int | None = None
        self.conn = None
        self._finalizer = None

    def run(self, k: int, kwargs: dict, n: int, timeout: float | None) -> tuple[str, Any]:
        """("ok", reply) | ("error", why the process ended) | ("timeout", None) for `fns[k](**kwargs)`."""
        if self.pid is not None and self._ended():  # it ended between calls (nothing of a call was lost)
            self._forget()
        try:
            data = ForkingPickler.dumps((k, kwargs, n))
        except Exception as e:  # noqa: BLE001 - a column that does not pickle: that call fails, not the run
            return "error", (f"its inputs cannot be sent to the reward's process ({type(e).__name__}: {e}); "
                             f"set reward.isolate=false to call rewards in the trainer's process")
        if self.pid is None:
            self._start()
        try:
            self.conn.send_bytes(data)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return "error", f"the reward's process was gone: {self._end()}"
        try:
            ready = self.conn.poll(timeout)
        except BaseException:  # Ctrl-C while waiting: the call is abandoned, and so is its process
            self._end(kill=True)
            raise
        if not ready:
            self._dump_stacks(timeout)
            self._end(kill=True)
            return "timeout", None
        try:
            return "ok", self.conn.recv()
        except (EOFError, OSError):
            return "error", f"the reward's process ended inside the call: {self._end()}"

    def _dump_stacks(self, timeout: float) -> None:
        """Before the kill: the child writes its threads' Python stacks to the trainer's stderr, under a line that
        says whose they are (where a slow reward spent its time, or where a child stuck on a lock stood)."""
        if DUMP_SIGNAL is None:
            return
        try:  # where the stacks go (sys.stderr may be another stream: a notebook's, pytest's capture)
            os.write(STDERR_FD, f"tinyrl: the reward's process (pid {self.pid}) is past reward.timeout={timeout:g} s; "
                                f"its stacks, then it is killed:\n".encode())
        except OSError:
            pass
        try:
            os.kill(self.pid, DUMP_SIGNAL)
        except OSError:
            return
        time.sleep(DUMP_WAIT_S)  # the dump is a few writes from a signal handler; no reply to wait on

    def start(self) -> None:
        """Fork the child now, if it is not running (a caller about to call from a worker thread forks on
        its own thread first: a fork copies only the forking thread, and locks other threads held)."""
        if self.pid is not None and self._ended():
            self._forget()
        if self.pid is None:
            self._start()

    def _ended(self) -> bool:
        try:
            return bool(os.waitpid(self.pid, os.WNOHANG)[0])
        except ChildProcessError:
            return True

    def _start(self) -> None:
        parent, child = Pipe(duplex=True)
        gc.freeze()  # the objects the child inherits stay untouched by its collector: fewer copied pages
        try:
            pid = os.fork()
        except BaseException:
            gc.unfreeze()
            raise
        if pid == 0:
            code = 0
            try:
                parent.close()
                _child_setup()
                _serve(child, self.fns, self._call)
            except BaseException:  # noqa: BLE001 - the child never returns into the trainer's code
                code = 1
            finally:
                os._exit(code)
        gc.unfreeze()
        child.close()
        self.pid, self.conn = pid, parent
        self._finalizer = weakref.finalize(self, _stop, pid, parent)

    def _end(self, kill: bool = False) -> str:
        """Reap the child (killed first when `kill`, or when it is still running); how it ended, in words."""
        pid = self.pid
        if kill:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 1.0  # its pipe closes a moment before it can be reaped
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:  # it closed its pipe but runs on
                os.kill(pid, signal.SIGKILL)
                status = os.waitpid(pid, 0)[1]
                break
            time.sleep(0.005)
        self._forget()
        return describe_exit(status)

    def _forget(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        try:
            self.conn.close()
        except OSError:
            pass
        self.pid = self.conn = self._finalizer = None

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self.pid = self.conn = self._finalizer = None


def _stop(pid: int, conn) -> None:
    """End a child that is no longer needed (the reward set went away, or the trainer exits)."""
    try:
        conn.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (OSError, ChildProcessError):
        pass
