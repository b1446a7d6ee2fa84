"""Weights & Biases (`log.report_to: [wandb]`, `pip install "tinyrl-rlvr[wandb]"`).

The wandb files go in the run folder (`<run>/wandb/`). WANDB_MODE decides online or offline as
wandb documents it; when it is not set and wandb cannot start online (no login, no network), the
run logs offline (one warning saying how to log in and `wandb sync` later); without a network wandb
first waits its `init_timeout` (90 s unless WANDB_INIT_TIMEOUT says otherwise). A resume continues
the same wandb run: its id is kept in tracker.json.
"""

from __future__ import annotations

import logging
import os

from tinyrl.trackers.base import Tracker, TrackerContext, require

log = logging.getLogger("tinyrl.trackers")


class WandbTracker(Tracker):
    name = "wandb"
    fix = ("log in with `wandb login` (or set WANDB_API_KEY) and check the network, or set WANDB_MODE=offline "
           "and `wandb sync` the run's wandb/ folder later")

    def __init__(self, ctx: TrackerContext):
        super().__init__(ctx)
        wandb = self.wandb = require("wandb", "wandb")
        run_id = ctx.resume.get("id")
        kwargs = dict(project=ctx.project, name=ctx.run_name, dir=str(ctx.run_path), config=ctx.config, id=run_id,
                      resume="allow" if run_id else None,
                      settings=wandb.Settings(console="off", silent=True, disable_git=True))  # the log stays ours
        mode = os.environ.get("WANDB_MODE")
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as e:
            if mode:  # the user chose the mode: that one or none
                raise
            log.warning("wandb could not start online (%s: %s): logging offline in %s/wandb instead; to see it in "
                        "wandb, run `wandb login`, then `wandb sync` its offline-run folder", type(e).__name__, e,
                        ctx.run_path)
            self.run = wandb.init(mode="offline", **kwargs)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_config(self, config: dict, step: int) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_event(self, name: str, text: str, step: int, level: str = "warn") -> None:
        levels = {"info": self.wandb.AlertLevel.INFO, "warn": self.wandb.AlertLevel.WARN,
                  "error": self.wandb.AlertLevel.ERROR}
        self.run.alert(title=name, text=f"step {step}: {text}", level=levels[level])

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({name: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.run.finish()

    def state(self) -> dict:
        offline = bool(getattr(self.run, "offline", False))
        out = {"id": self.run.id, "project": self.run.project, "mode": "offline" if offline else "online",
               "dir": str(self.run.settings.sync_dir)}
        if offline:
            out["command"] = f"wandb sync {self.run.settings.sync_dir}"
        else:
            out["url"] = self.run.url
        return out
