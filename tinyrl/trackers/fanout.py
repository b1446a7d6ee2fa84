"""The trackers a run reports to (`log.report_to`), behind one object the trainer calls.

`open_trackers` opens each named tracker on rank 0 (other ranks, and a run that names none, get an
empty fan-out that imports nothing). Every call goes to every tracker; a tracker that raises (not
installed, no network, no login, a full disk) never stops training: the first failure of each
tracker is one warning naming the fix, later ones are counted and written to tracker.json.

tracker.json (in the run folder) holds each tracker's `state()`: its run id, so a resumed run
continues the same tracker run, and its URL or local folder, which the UI links to.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from tinyrl.runs import atomic_write_text
from tinyrl.trackers.base import Tracker, TrackerContext
from tinyrl.trackers.registry import TRACKERS

log = logging.getLogger("tinyrl.trackers")
STATE_FILE = "tracker.json"
DEFAULT_PROJECT = "tinyrl"


def read_state(run_path: Path) -> dict:
    """tracker.json of a run folder ({} when there is none or it does not parse)."""
    try:
        data = json.loads((Path(run_path) / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def scalars(metrics: dict) -> dict[str, float]:
    """The finite numbers of a metrics row, without `step` (a quantity not measured is left out, not 0).

    >>> scalars({"step": 3, "loss": 0.5, "reward_mean": None, "kl": float("nan"), "mode": "packed", "n": 4})
    {'loss': 0.5, 'n': 4}
    """
    return {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


def table(samples: list[dict]) -> tuple[list[str], list[list]]:
    """(columns, rows) of samples.jsonl rows: every key in first-seen order; lists and dicts as JSON.

    >>> table([{"step": 1, "prompt": "1+1=", "reward": 1.0}, {"step": 1, "prompt": "2+2=", "turns": [1]}])
    (['step', 'prompt', 'reward', 'turns'], [[1, '1+1=', 1.0, None], [1, '2+2=', None, '[1]']])
    """
    columns = list(dict.fromkeys(k for s in samples for k in s))
    cell = lambda v: json.dumps(v, default=str) if isinstance(v, (list, dict)) else v  # noqa: E731
    return columns, [[cell(s.get(c)) for c in columns] for s in samples]


class Trackers:
    """Every open tracker of a run; each call goes to all of them and never raises."""

    def __init__(self, trackers: list[Tracker], run_path: Path | None = None, samples_every: int = 0):
        self.trackers, self.run_path, self.samples_every = trackers, run_path, samples_every
        self.previous = read_state(run_path) if run_path is not None else {}  # tracker.json as the run left it
        self.errors: dict[str, int] = {}  # tracker name -> calls that raised

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def failed(self, name: str, what: str, e: BaseException, fix: str) -> None:
        """Count a tracker's failure; the first one of each tracker is a warning naming the fix."""
        self.errors[name] = self.errors.get(name, 0) + 1
        if self.errors[name] == 1:
            log.warning("log.report_to: %s failed in %s (%s: %s); training goes on (its later failures are "
                        "counted in %s). Fix: %s", name, what, type(e).__name__, e, STATE_FILE, fix)

    def _each(self, method: str, *args) -> None:
        for t in self.trackers:
            try:
                getattr(t, method)(*args)
            except Exception as e:  # a tracker must never stop the run
                self.failed(t.name, method, e, t.fix)

    def log_step(self, step: int, metrics: dict, samples: list[dict], alarms: list) -> None:
        """One training step: its metrics, its samples as a table every `log.samples_every` steps, its alarms."""
        if not self.trackers:
            return
        self._each("log_metrics", scalars(metrics), step)
        if self.samples_every and step % self.samples_every == 0 and samples:
            self._each("log_table", "samples", *table(samples), step)
        for a in alarms:
            text = f"{a.evidence}. Suggested: {a.action}" + (f" (auto-action: {a.applied})" if a.applied else "")
            self._each("log_event", a.name, text, a.step, "error" if a.fatal else "warn")

    def held_out(self, accuracy: float | None, step: int) -> None:
        """Held-out greedy pass@1 at a step (0: before training)."""
        if accuracy is not None:
            self._each("log_metrics", {"held_out/accuracy": accuracy}, step)

    def close(self) -> None:
        """Finish every tracker's run (the trainer closes this with its JSONL writers); tracker.json keeps
        their state and error counts."""
        if not self.trackers:
            return
        self._each("finish")
        self.save()
        for name, n in self.errors.items():
            log.info("log.report_to: %s failed %d time(s) in this session of the run", name, n)  # warned once

    def save(self) -> None:
        """tracker.json: each tracker's state over the one the run folder held; `errors`: its failed calls,
        every session of the run together."""
        state = {k: dict(v) for k, v in self.previous.items() if isinstance(v, dict)}
        for t in self.trackers:
            entry = state.setdefault(t.name, {})
            try:
                entry.update(t.state())
            except Exception as e:
                self.failed(t.name, "state", e, t.fix)
            if t.name in self.errors:
                entry["errors"] = self.previous.get(t.name, {}).get("errors", 0) + self.errors[t.name]
        try:
            atomic_write_text(self.run_path / STATE_FILE, json.dumps(state, indent=2, default=str))
        except OSError as e:
            log.warning("could not write %s: %s", self.run_path / STATE_FILE, e)


def open_trackers(cfg, run_path: Path, is_main: bool = True, start_step: int = 0) -> Trackers:
    """The trackers `cfg.log.report_to` names, opened for the run in `run_path` (continuing the tracker
    runs its tracker.json names); an empty fan-out on ranks other than 0 or when it names none."""
    names = list(cfg.log.report_to)
    if not names or not is_main:
        return Trackers([])
    out = Trackers([], Path(run_path), cfg.log.samples_every)
    for name in names:
        ctx = TrackerContext(cfg.log.tracker_project or DEFAULT_PROJECT, run_name(Path(run_path)), Path(run_path),
                             cfg.to_dict(), start_step, dict(out.previous.get(name) or {}))
        cls = None
        try:
            cls = TRACKERS[name]
            tracker = cls(ctx)
            tracker.name = name
        except Exception as e:  # not installed, no login, no network: the run trains without it
            fix = f'pip install "tinyrl-rlvr[{name}]"' if isinstance(e, ImportError) else getattr(cls, "fix", "")
            out.failed(name, "opening its run", e, fix or "see the error above")
            continue
        out.trackers.append(tracker)
    if out.trackers:
        out._each("log_config", cfg.to_dict(), start_step)
        out.save()
        for t in out.trackers:
            log.info("log.report_to: %s %s", t.name, _where(t))
    return out


def run_name(path: Path) -> str:
    """The tracker run's name: the run folder's; a stage of a chain (<run>/stages/02-grpo) is <run>-02-grpo.

    >>> run_name(Path("runs/tiny")), run_name(Path("runs/tiny/stages/02-grpo"))
    ('tiny', 'tiny-02-grpo')
    """
    return f"{path.parent.parent.name}-{path.name}" if path.parent.name == "stages" else path.name


def _where(t: Tracker) -> str:
    try:
        s = t.state()
    except Exception:
        return ""
    return s.get("url") or " ".join(x for x in (s.get("dir"), s.get("command") and f"({s['command']})") if x)
