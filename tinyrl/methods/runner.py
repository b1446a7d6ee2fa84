"""Run a resolved run: its folder opened once, its method's runner called with it."""


from __future__ import annotations

from tinyrl.config import Resolved
from tinyrl.methods.common import open_run
from tinyrl.methods.registry import CHAIN, METHODS
from tinyrl.registry import load_object
from tinyrl.runs import Run
from tinyrl.stop import StopSignals


def runner(method: str):
    """The function that runs `method` (a registry name or "chain"): run(cfg, run_dir, resume) -> Run."""
    return load_object(CHAIN) if method == "chain" else METHODS[method]


def run_method(resolved: Resolved) -> Run:
    """Run (or continue) the resolved run in its folder; the folder is unlocked when it returns. A fresh
    folder that a failed start left holding nothing but its config is removed again; so is one that a
    Ctrl-C or SIGTERM during start-up stopped (StopSignals: both raise KeyboardInterrupt until the
    trainer takes them over, so a start-up never dies of the signal's default action half done)."""
    with StopSignals():
        folder = open_run(resolved)
        try:
            return runner(resolved.method)(resolved.cfg, folder, resume=resolved.resume is not None)
        except BaseException:
            if resolved.resume is None:
                folder.discard()  # keeps a folder that holds any progress
            raise
        finally:
            folder.unlock()
