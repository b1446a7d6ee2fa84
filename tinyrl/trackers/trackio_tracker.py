"""trackio (`log.report_to: [trackio]`, `pip install "tinyrl-rlvr[trackio]"`): a local SQLite store,
no account, no network.

The store is trackio's own: TRACKIO_DIR, else `$HF_HOME/trackio` (trackio reads it when first
imported); `trackio show --project <log.tracker_project>` opens its dashboard. It is checked to be a
folder this process can write before the run opens: trackio itself starts on a store it cannot
write and loses every metric in its background writer, with no error to count. The run is named after
the run folder; a resume continues it (trackio resumes a run by name; tracker.json keeps name and id).
"""

from __future__ import annotations

import os
from pathlib import Path

from tinyrl.trackers.base import Tracker, TrackerContext, require


def check_store(store: Path) -> None:
    """OSError naming the fix unless trackio's store is (or can be made) a folder this process writes."""
    where = f"TRACKIO_DIR={store}" if os.environ.get("TRACKIO_DIR") else f"trackio's store {store} ($HF_HOME/trackio)"
    fix = "set TRACKIO_DIR to a folder you can write (trackio creates it)"
    if store.exists() and not store.is_dir():
        raise NotADirectoryError(f"{where} is a file, not a folder: {fix}")
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"{where} cannot be created ({e.strerror or e}): {fix}") from e
    if not os.access(store, os.W_OK | os.X_OK):
        raise PermissionError(f"{where} is not writable: {fix}")


class TrackioTracker(Tracker):
    name = "trackio"
    fix = "point TRACKIO_DIR at a writable folder (trackio's store; unset, it is $HF_HOME/trackio)"

    def __init__(self, ctx: TrackerContext):
        super().__init__(ctx)
        trackio = self.trackio = require("trackio", "trackio")
        check_store(Path(trackio.utils.TRACKIO_DIR))  # where this process's trackio keeps its store
        self.run = trackio.init(project=ctx.project, name=ctx.resume.get("name") or ctx.run_name, config=ctx.config,
                                resume="allow" if ctx.resume.get("name") else "never", embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_config(self, config: dict, step: int) -> None:
        self.run.config.update(config)  # trackio stores the config with the run's next log record

    def log_event(self, name: str, text: str, step: int, level: str = "warn") -> None:
        levels = {"info": self.trackio.AlertLevel.INFO, "warn": self.trackio.AlertLevel.WARN,
                  "error": self.trackio.AlertLevel.ERROR}
        self.run.alert(title=name, text=text, level=levels[level], step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({name: self.trackio.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        if self.trackio.context_vars.current_run.get() is self.run:
            self.trackio.finish()  # also forgets it as trackio's current run (else its atexit finishes it again)
        else:
            self.run.finish()

    def state(self) -> dict:
        store = self.trackio.utils.TRACKIO_DIR  # where this process's trackio keeps its store
        out = {"id": self.run.id, "name": self.run.name, "project": self.ctx.project, "dir": str(store),
               "command": f'trackio show --project "{self.ctx.project}"'}
        if self.run.url:
            out["url"] = self.run.url
        return out
