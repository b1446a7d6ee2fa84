"""Ctrl-C and SIGTERM as a stop request: the one mechanism every method uses.

Inside `StopSignals(defer)`, the first SIGINT / SIGTERM sets `requested` when `defer()` says the
work in hand should finish first (the GRPO trainer inside a step, SFT until TRL's next optimiser
step), and raises KeyboardInterrupt otherwise; a second signal always raises KeyboardInterrupt.
A method turns KeyboardInterrupt into a resumable stop (a checkpoint, or the last one kept).
Off the main thread (a UI's worker) signals cannot be caught, and nothing is installed.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Callable

log = logging.getLogger("tinyrl")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    def __init__(self, defer: Callable[[], bool] = lambda: False, what: str = "this step"):
        self.defer = defer
        self.what = what  # what a deferred stop lets finish, for the log line
        self.requested = False
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        if not self.requested and self.defer():
            self.requested = True
            log.warning("stopping after %s (signal %d); Ctrl-C again to stop at once", self.what, signum)
            return
        raise KeyboardInterrupt
