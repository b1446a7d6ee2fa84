"""trackio (`log.report_to: [trackio]`, `pip install "tinyrl-rlvr[trackio]"`): a local SQLite store,
no account, no network.

The store is trackio's own: TRACKIO_DIR, else `$HF_HOME/trackio` (trackio reads it when first
imported); `trackio show --project <log.tracker_project>` opens its dashboard. The run is named after
the run folder; a resume continues it (trackio resumes a run by name; tracker.json keeps name and id).
"""

from __future__ import annotations

from tinyrl.trackers.base import Tracker, TrackerContext, require


class TrackioTracker(Tracker):
    name = "trackio"
    fix = "check that trackio's store (TRACKIO_DIR, else $HF_HOME/trackio) is writable"

    def __init__(self, ctx: TrackerContext):
        super().__init__(ctx)
        trackio = self.trackio = require("trackio", "trackio")
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
