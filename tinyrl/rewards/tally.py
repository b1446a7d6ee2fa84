"""Per-call tallies a reward function reports beside its scores (the code sandbox's outcome counts).

A reward returns one number per completion; what it saw on the way (how many runs passed,
timed out or crashed, the seconds it spent in the sandbox) goes to `add(key, value)`, called on
the thread that called the reward. The caller (`tinyrl.rewards.core.outcome`) opens a tally
before the call and takes it after, in whichever process the reward runs (the rewards' forked
process included: the tally travels back with the scores), and the trainer sums the step's
tallies into metrics.jsonl under their keys. Outside such a call, `add` does nothing.

>>> with collecting() as got:
...     add("sandbox/pass", 2); add("sandbox/pass"); add("sandbox_time", 0.5)
>>> got
{'sandbox/pass': 3, 'sandbox_time': 0.5}
>>> add("sandbox/pass")  # no tally open: ignored
"""

from __future__ import annotations

import contextlib
import threading

_local = threading.local()


def add(key: str, value: float = 1) -> None:
    """Add `value` to `key` of the tally open on this thread (nothing when none is open)."""
    tally = getattr(_local, "tally", None)
    if tally is not None:
        tally[key] = tally.get(key, 0) + value


@contextlib.contextmanager
def collecting():
    """Open a fresh tally on this thread for the block; yields the dict it fills."""
    outer = getattr(_local, "tally", None)
    _local.tally = got = {}
    try:
        yield got
    finally:
        _local.tally = outer
