"""Each tracker's calls on a thread of its own, each waited for at most a time box: a tracker that hangs
(a blocking socket with no network, a stuck lock, a full pipe) costs the run one box, once.

Python cannot kill a thread, so a call that outlives its box is abandoned, not stopped: it goes on in
the tracker's thread, and every later call to that tracker is dropped at once, without waiting, while
it is still stuck; when it returns, calls go through again (a tracker that hung on a network blip
comes back). One call at most is in flight per tracker, so nothing queues up behind a stuck one.
The fan-out (fanout.py) counts each abandoned or dropped call as a failed one in tracker.json and
warns once. The threads are daemons: a call stuck forever does not keep the process alive at exit.

A tracker is opened on its thread too, so all of its calls, from its init to its finish, run on one
thread (trackio keeps its current run in a context variable of the thread that opened it).
"""

from __future__ import annotations

import queue
import threading
import time

CALL_S = 10.0  # the box of a call during the run (a metrics row, a table, an alarm, the state)
OPEN_S = 120.0  # the box of opening a tracker's run (wandb online may take its init_timeout, 90 s)
CLOSE_S = 60.0  # all trackers finish together within this at the end (wandb uploads what is left)


class Call:
    """One call handed to a tracker's thread: `done` is set when it returned or raised."""

    def __init__(self, fn, args: tuple, what: str):
        self.fn, self.args, self.what = fn, args, what
        self.done = threading.Event()
        self.result, self.error = None, None
        self.started, self.ended = time.monotonic(), None


class Worker:
    """The thread of one tracker: runs the calls handed to it one at a time, in order."""

    def __init__(self, name: str):
        self.name = name
        self.current: Call | None = None  # the last call handed over (in flight until its `done` is set)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # holds at most one call: see submit
        self._lock = threading.Lock()  # one submit at a time (the fan-out may be called from two threads)
        self._thread = threading.Thread(target=self._loop, name=f"tinyrl-tracker-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            call = self._jobs.get()
            if call is None:
                return
            try:
                call.result = call.fn(*call.args)
            except BaseException as e:  # noqa: BLE001 - reported to the caller, whatever it is
                call.error = e
            finally:
                call.ended = time.monotonic()
                call.done.set()

    @property
    def stuck(self) -> bool:
        """Whether a call handed over earlier is still running."""
        return self.current is not None and not self.current.done.is_set()

    def submit(self, fn, *args, what: str = "") -> Call | None:
        """Hand `fn(*args)` to the thread and return it; None (dropped) while an earlier call still runs."""
        with self._lock:
            if self.stuck:
                return None
            self.current = call = Call(fn, args, what or getattr(fn, "__name__", "call"))
            self._jobs.put(call)
        return call

    def settle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the call in flight, if any, to return; whether none is left running."""
        return self.current is None or self.current.done.wait(max(0.0, timeout))

    def stop(self) -> None:
        """End the thread once its call in flight (if one is stuck: whenever that returns) is done."""
        self._jobs.put(None)


def wait_all(calls: list[Call | None], timeout: float) -> None:
    """Wait for every call together: at most `timeout` s in all, however many trackers hang."""
    deadline = time.monotonic() + timeout
    for c in calls:
        if c is not None:
            c.done.wait(max(0.0, deadline - time.monotonic()))
