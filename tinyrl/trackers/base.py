"""What every tracker implements: a run opened from a `TrackerContext`, then metrics, the config,
events (the monitor's alarms), tables (samples) and finish. A tracker may raise anywhere: the
fan-out (fanout.py) catches it, warns once with the tracker's `fix`, and training goes on. It may
hang, too: all of a tracker's calls, its opening included, run on one thread of its own (guard.py),
waited for at most a time box."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinyrl.errors import MissingExtra


@dataclass
class TrackerContext:
    """What a tracker opens its run with."""

    project: str  # log.tracker_project, else "tinyrl"
    run_name: str  # the run folder's name
    run_path: Path  # the run folder: offline files (wandb, TensorBoard) go inside it
    config: dict  # the resolved run config
    start_step: int = 0  # the step the run continues from (0: a fresh run)
    resume: dict = field(default_factory=dict)  # this tracker's entry of tracker.json (empty: a fresh run)


def require(module: str, extra: str) -> Any:
    """Import an optional tracker package, or ImportError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(f"log.report_to {extra!r} needs the {module} package: "
                          f"pip install \"tinyrl-rlvr[{extra}]\"") from e


class Tracker:
    """One tracker's run. Steps are the trainer's optimiser steps (0: before training)."""

    name = ""  # its registry name
    fix = ""  # what to do when it fails, in words (named in the one warning)

    def __init__(self, ctx: TrackerContext):
        self.ctx = ctx

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_config(self, config: dict, step: int) -> None:
        raise NotImplementedError

    def log_event(self, name: str, text: str, step: int, level: str = "warn") -> None:
        """A named event at a step (a monitor alarm); level: info | warn | error."""
        raise NotImplementedError

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError

    def state(self) -> dict:
        """What tracker.json keeps of this run: its id (to continue it on a resume), and where to see it
        (`url` where the tracker has one, else a local `dir` and the `command` that shows it)."""
        return {}
