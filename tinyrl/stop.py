"""Ctrl-C and SIGTERM as a stop request: the one mechanism every method uses.

Inside `StopSignals(defer)`, the first SIGINT / SIGTERM sets `requested` when `defer()` says the
work in hand should finish first (the GRPO trainer inside a step, SFT until TRL's next optimiser
step), and raises KeyboardInterrupt otherwise; a second signal always raises KeyboardInterrupt.
A method turns KeyboardInterrupt into a resumable stop (a checkpoint, or the last one kept).
Off the main thread (a UI's worker) signals cannot be caught, and nothing is installed.

A deferred stop has a deadline (`deadline_s`, the trainer's train.stop_timeout_s): a step that has not
finished by then is interrupted (KeyboardInterrupt in the main thread: the step is abandoned, the last
checkpoint kept), and a process that still has not stopped `grace_s` later (stuck in native code) exits
at once with status 130. A `timeout 90 tinyrl train ...` therefore ends, whatever the step was doing.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger("tinyrl")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    def __init__(self, defer: Callable[[], bool] = lambda: False, what: str = "this step",
                 deadline_s: float | None = None, grace_s: float = 30.0):
        self.defer = defer
        self.what = what  # what a deferred stop lets finish, for the log line
        self.deadline_s, self.grace_s = deadline_s, grace_s  # None: no deadline
        self.requested = False
        self._previous: dict = {}
        self._timers: list[threading.Timer] = []

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for t in self._timers:
            t.cancel()
        self._timers = []
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        if not self.requested and self.defer():
            self.requested = True
            log.warning("stopping after %s (signal %d); Ctrl-C again to stop at once", self.what, signum)
            if self.deadline_s is not None:
                self._start(self.deadline_s, self._interrupt)
            return
        raise KeyboardInterrupt

    def _start(self, seconds: float, fn) -> None:
        t = threading.Timer(seconds, fn)
        t.daemon = True
        t.start()
        self._timers.append(t)

    def _interrupt(self) -> None:
        """The deadline passed inside the work in hand: abandon it (its last checkpoint stays)."""
        log.warning("%s did not finish within %g s of the stop request: stopping inside it (the last checkpoint "
                    "is kept)", self.what, self.deadline_s)
        self._start(self.grace_s, self._exit)
        _thread.interrupt_main()

    def _exit(self) -> None:
        log.error("still running %g s after the stop deadline (stuck outside Python?): exiting now; resume from "
                  "the last checkpoint", self.grace_s)
        logging.shutdown()
        os._exit(130)
