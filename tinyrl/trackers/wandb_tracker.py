"""Weights & Biases (`log.report_to: [wandb]`, `pip install "tinyrl-rlvr[wandb]"`).

The wandb files go in the run folder (`<run>/wandb/`). WANDB_MODE decides online or offline as
wandb documents it; when it is not set, the wandb host (its base_url, or the HTTPS proxy in front of
it) is probed first with a TCP connection of at most PROBE_S seconds: unreachable, the run logs
offline at once (one warning saying so, and how to `wandb sync` later) instead of waiting wandb's own
`init_timeout` (90 s). Reachable, but wandb still cannot start online (no login, a refused key), the
run logs offline too, with one warning saying how to log in. A resume continues the same wandb run:
its id is kept in tracker.json.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import urllib.parse
import urllib.request

from tinyrl.trackers.base import Tracker, TrackerContext, require

log = logging.getLogger("tinyrl.trackers")
PROBE_S = 3.0  # the reachability probe of the wandb host: name lookup and TCP connect together


def reachable(url: str, timeout: float = PROBE_S) -> bool:
    """Whether a TCP connection to `url`'s host (or to the HTTPS proxy the environment names for it)
    opens within `timeout` s. The lookup and connect run on a daemon thread waited for `timeout` s:
    getaddrinfo takes no timeout of its own."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname, parts.port or (80 if parts.scheme == "http" else 443)
    proxy = urllib.request.getproxies().get(parts.scheme or "https")
    if proxy and host and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = p.hostname, p.port or 80
    if not host:
        return False
    done = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            done.append(True)
        except OSError:
            pass

    t = threading.Thread(target=connect, name="tinyrl-wandb-probe", daemon=True)
    t.start()
    t.join(timeout)
    return bool(done)


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
        settings = None if mode else wandb.setup().settings  # the environment's and `wandb offline`'s choice
        url = settings.base_url if settings is not None and settings.mode == "online" else None  # WANDB_BASE_URL
        if url and not reachable(url):
            log.warning("wandb: %s cannot be reached (probed for at most %g s): logging offline in %s/wandb "
                        "instead; once online, `wandb login` if needed and `wandb sync` its offline-run folder "
                        "(WANDB_MODE=offline skips this check)", url, PROBE_S, ctx.run_path)
            mode = "offline"
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as e:
            if mode:  # the user chose the mode (or no network chose offline): that one or none
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
