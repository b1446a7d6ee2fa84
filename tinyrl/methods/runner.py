"""Run a resolved run: its folder opened once, its method's runner called with it."""


from __future__ import annotations

from typing import Callable, TypeVar

from tinyrl.config import Resolved
from tinyrl.methods.common import open_run
from tinyrl.methods.registry import CHAIN, METHODS
from tinyrl.registry import load_object
from tinyrl.runs import Run, RunDir
from tinyrl.stop import StopSignals

T = TypeVar("T")


def runner(method: str):
    """The function that runs `method` (a registry name or "chain"): run(cfg, run_dir, resume) -> Run."""
    return load_object(CHAIN) if method == "chain" else METHODS[method]


def run_method(resolved: Resolved) -> Run:
    """Run (or continue) the resolved run in its folder; the folder is unlocked when it returns. A fresh
    folder that a failed start left holding nothing but its config is removed again; so is one that a
    Ctrl-C or SIGTERM during start-up stopped (StopSignals: both raise KeyboardInterrupt until the
    trainer takes them over, so a start-up never dies of the signal's default action half done)."""
    with StopSignals():
        return in_folder(resolved, lambda folder: runner(resolved.method)(resolved.cfg, folder,
                                                                          resume=resolved.resume is not None))


def in_folder(resolved: Resolved, work: Callable[[RunDir], T], keep_lock: bool = False) -> T:
    """`work(folder)` in the run's folder, opened once (common.open_run). On an error a fresh folder is
    discarded (RunDir.discard keeps one that holds any progress) and unlocked; on success it is unlocked
    unless `keep_lock` (a trainer handed to the caller, who unlocks it: tinyrl.api.build_trainer)."""
    folder = open_run(resolved)
    try:
        out = work(folder)
    except BaseException:
        if resolved.resume is None:
            folder.discard()
        folder.unlock()
        raise
    if not keep_lock:
        folder.unlock()
    return out
