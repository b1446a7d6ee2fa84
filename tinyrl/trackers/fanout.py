"""The trackers a run reports to (`log.report_to`), behind one object the trainer calls.

`open_trackers` opens each named tracker on rank 0 (other ranks, and a run that names none, get an
empty fan-out that imports nothing). Every call goes to every tracker; a tracker that raises (not
installed, no network, no login, a full disk) never stops training: the first failure of each
tracker is one warning naming the fix, later ones are counted and written to tracker.json.

A tracker that hangs cannot stall the run either: each tracker's calls run on a thread of its own
(guard.py) and are waited for at most a time box (CALL_S during the run, OPEN_S to open, CLOSE_S to
finish, all trackers together). A call past its box is abandoned and warned once; while it is stuck,
that tracker's calls are dropped at once; when it returns they go through again. Each timed-out or
dropped call is a failed call in tracker.json (`errors`; `timeouts` counts the abandoned ones).

tracker.json (in the run folder) holds each tracker's `state()`: its run id, so a resumed run
continues the same tracker run, and its URL or local folder, which the UI links to.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from tinyrl.runs import atomic_write_text
from tinyrl.trackers.base import Tracker, TrackerContext
from tinyrl.trackers.guard import CALL_S, CLOSE_S, OPEN_S, Worker, wait_all
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


def _entry(state: dict, name: str) -> dict:
    """A tracker's entry of tracker.json ({} when it has none, or not a mapping)."""
    got = state.get(name)
    return dict(got) if isinstance(got, dict) else {}


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
    """Every open tracker of a run; each call goes to all of them at once, each on its own thread
    (guard.py), waits at most a time box for them together, and never raises."""

    def __init__(self, trackers: list[Tracker], run_path: Path | None = None, samples_every: int = 0,
                 call_s: float = CALL_S, close_s: float = CLOSE_S):
        self.slots = [(t, Worker(t.name)) for t in trackers]  # each open tracker and its thread
        self.run_path, self.samples_every, self.call_s, self.close_s = run_path, samples_every, call_s, close_s
        self.previous = read_state(run_path) if run_path is not None else {}  # tracker.json as the run left it
        self.errors: dict[str, int] = {}  # tracker name -> calls that raised, timed out or were dropped
        self.timeouts: dict[str, int] = {}  # tracker name -> calls abandoned after their time box
        self._warned: set[tuple[str, str]] = set()  # (tracker, "failed" | "timed out"): warned once each
        self._stuck: set[str] = set()  # trackers with a call abandoned and not yet returned
        self.closed = False  # after close: every call does nothing

    def __bool__(self) -> bool:
        return bool(self.slots)

    @property
    def trackers(self) -> list[Tracker]:
        return [t for t, _ in self.slots]

    def failed(self, name: str, what: str, e: BaseException, fix: str) -> None:
        """Count a tracker's failure; the first one of each tracker is a warning naming the fix."""
        self.errors[name] = self.errors.get(name, 0) + 1
        if (name, "failed") not in self._warned:
            self._warned.add((name, "failed"))
            log.warning("log.report_to: %s failed in %s (%s: %s); training goes on (its later failures are "
                        "counted in %s). Fix: %s", name, what, type(e).__name__, e, STATE_FILE, fix)

    def timed_out(self, name: str, what: str, box: float, fix: str) -> None:
        """Count a call abandoned after its time box; the first one of each tracker is a warning."""
        self.errors[name] = self.errors.get(name, 0) + 1
        self.timeouts[name] = self.timeouts.get(name, 0) + 1
        self._stuck.add(name)
        if (name, "timed out") not in self._warned:
            self._warned.add((name, "timed out"))
            log.warning("log.report_to: %s did not answer within %g s in %s; training goes on without waiting "
                        "for it: its calls are dropped while that one is stuck (each counted in %s). Fix: %s",
                        name, box, what, STATE_FILE, fix)

    def _each(self, method: str, *args, box: float | None = None) -> list[tuple[Tracker, object]]:
        """`method(*args)` on every tracker at once, each on its thread, waited for together up to `box`
        s (default: call_s); returns (tracker, result) of those that answered."""
        if self.closed:
            return []
        calls = []
        for t, w in self.slots:
            if t.name in self._stuck and not w.stuck:
                self._stuck.discard(t.name)
                c = w.current
                log.info("log.report_to: %s answered again (its %s took %.0f s); its calls go through again",
                         t.name, c.what, c.ended - c.started)
            calls.append(w.submit(getattr(t, method), *args, what=method))
        box = self.call_s if box is None else box
        wait_all(calls, box)
        out = []
        for (t, _), c in zip(self.slots, calls):
            if c is None:  # an earlier call of this tracker is still stuck: dropped without waiting
                self.errors[t.name] = self.errors.get(t.name, 0) + 1
            elif not c.done.is_set():
                self.timed_out(t.name, method, box, t.fix)
            elif c.error is not None:
                self.failed(t.name, method, c.error, t.fix)
            else:
                out.append((t, c.result))
        return out

    def log_step(self, step: int, metrics: dict, samples: list[dict], alarms: list) -> None:
        """One training step: its metrics, its samples as a table every `log.samples_every` steps, its alarms."""
        if not self.slots:
            return
        self._each("log_metrics", scalars(metrics), step)
        if self.samples_every and step % self.samples_every == 0 and samples:
            self._each("log_table", "samples", *table(samples), step)
        for a in alarms:
            text = f"{a.evidence}. Suggested: {a.action}" + (f" (auto-action: {a.applied})" if a.applied else "")
            self._each("log_event", a.name, text, a.step, "error" if a.fatal else "warn")

    def held_out(self, accuracy: float | None, step: int) -> None:
        """Held-out greedy pass@1 at a step (0: before training)."""
        if accuracy is not None and self.slots:
            self._each("log_metrics", {"held_out/accuracy": accuracy}, step)

    def held_out_sampled(self, results: dict | None, step: int) -> None:
        """Held-out pass@k and maj@k at a step (0: before training): `results` is one sampled evaluation as
        summary.json's details.eval_sampled holds it (SampledEval.to_dict); None or {}: nothing is sent."""
        metrics = sampled_metrics(results or {})
        if metrics and self.slots:
            self._each("log_metrics", metrics, step)

    def benchmark_results(self, results: dict, step: int, prefix: str = "lm_eval") -> None:
        """Benchmark scores at a step, {task: {metric: value}} (lm-evaluation-harness results), sent as
        `<prefix>/<task>/<metric>`; values that are not finite numbers (stderr "N/A") are left out."""
        metrics = scalars({f"{prefix}/{task}/{m}": v for task, got in (results or {}).items()
                           for m, v in (got or {}).items()})
        if metrics and self.slots:
            self._each("log_metrics", metrics, step)

    def close(self) -> None:
        """Finish every tracker's run within `close_s` s in all (the trainer closes this with its JSONL
        writers): a stuck call gets up to half of it to return first; tracker.json keeps their state and
        error counts. A tracker still stuck then is left to its (daemon) thread."""
        if not self.slots or self.closed:
            return
        deadline = time.monotonic() + self.close_s
        for _, w in self.slots:
            w.settle(deadline - self.close_s / 2 - time.monotonic())
        self._each("finish", box=max(0.0, deadline - time.monotonic()))
        self.save()
        for _, w in self.slots:
            w.stop()
        self.closed = True  # later calls do nothing (their threads are gone)
        for name, n in self.errors.items():
            log.info("log.report_to: %s failed %d time(s) in this session of the run", name, n)  # warned once

    def save(self) -> dict:
        """tracker.json: each tracker's state over the one the run folder held; `errors`: its failed calls
        (a tracker that could not open included), `timeouts`: those abandoned after their time box, every
        session of the run together. Returns what it wrote."""
        state = {k: dict(v) for k, v in self.previous.items() if isinstance(v, dict)}
        for t, got in self._each("state"):
            state.setdefault(t.name, {}).update(got or {})
        for key, counts in (("errors", self.errors), ("timeouts", self.timeouts)):
            for name, n in counts.items():
                before = _entry(self.previous, name).get(key, 0)
                state.setdefault(name, {})[key] = (before if isinstance(before, int) else 0) + n
        try:
            atomic_write_text(self.run_path / STATE_FILE, json.dumps(state, indent=2, default=str))
        except OSError as e:
            log.warning("could not write %s: %s", self.run_path / STATE_FILE, e)
        return state


def sampled_metrics(results: dict) -> dict[str, float]:
    """The tracker metrics of one sampled evaluation (SampledEval.to_dict): pass@k and maj@k by k.

    >>> sampled_metrics({"samples": 4, "pass@k": {"1": 0.25, "4": 0.5}, "maj@k": {"4": 0.375}})
    {'held_out/pass@1': 0.25, 'held_out/pass@4': 0.5, 'held_out/maj@4': 0.375}
    >>> sampled_metrics({"pass@k": {"1": 0.5}, "maj@k": None, "maj_note": "answers are free text"})
    {'held_out/pass@1': 0.5}
    """
    return scalars({f"held_out/{kind}{k}": v for kind, key in (("pass@", "pass@k"), ("maj@", "maj@k"))
                    for k, v in (results.get(key) or {}).items()})


def open_trackers(cfg, run_path: Path, is_main: bool = True, start_step: int = 0, open_s: float = OPEN_S,
                  call_s: float = CALL_S, close_s: float = CLOSE_S) -> Trackers:
    """The trackers `cfg.log.report_to` names, opened for the run in `run_path` (continuing the tracker
    runs its tracker.json names), each on its own thread, together within `open_s` s; an empty fan-out
    on ranks other than 0 or when it names none."""
    names = list(cfg.log.report_to)
    if not names or not is_main:
        return Trackers([])
    out = Trackers([], Path(run_path), cfg.log.samples_every, call_s, close_s)
    opening = []
    for name in names:
        ctx = TrackerContext(cfg.log.tracker_project or DEFAULT_PROJECT, run_name(Path(run_path)), Path(run_path),
                             cfg.to_dict(), start_step, _entry(out.previous, name))
        worker = Worker(name)
        opening.append((name, worker, worker.submit(_open, name, ctx, what="opening its run")))
    wait_all([c for _, _, c in opening], open_s)
    for name, worker, call in opening:
        if call.done.is_set() and call.error is None:
            out.slots.append((call.result, worker))
            continue
        worker.stop()  # a stuck open: the thread ends when (if) it returns; its run is never used
        if not call.done.is_set():
            out.timed_out(name, "opening its run", open_s, _fix(name))
        else:  # not installed, no login, no network: the run trains without it
            e = call.error
            out.failed(name, "opening its run", e, f'pip install "tinyrl-rlvr[{name}]"' if isinstance(e, ImportError)
                       else _fix(name))
    if out.slots:
        out._each("log_config", cfg.to_dict(), start_step)
    if out.errors or out.slots:
        state = out.save()
        for t in out.trackers:
            log.info("log.report_to: %s %s", t.name, _where(state.get(t.name, {})))
    return out


def _fix(name: str) -> str:
    try:
        return TRACKERS[name].fix or "see the error above"
    except Exception:  # its module does not import: the error above says why
        return "see the error above"


def _open(name: str, ctx: TrackerContext) -> Tracker:
    """Open tracker `name`'s run (on the tracker's own thread)."""
    tracker = TRACKERS[name](ctx)
    tracker.name = name
    return tracker


def run_name(path: Path) -> str:
    """The tracker run's name: the run folder's; a stage of a chain (<run>/stages/02-grpo) is <run>-02-grpo.

    >>> run_name(Path("runs/tiny")), run_name(Path("runs/tiny/stages/02-grpo"))
    ('tiny', 'tiny-02-grpo')
    """
    return f"{path.parent.parent.name}-{path.name}" if path.parent.name == "stages" else path.name


def _where(s: dict) -> str:
    """Where a tracker shows the run, from its state: its URL, else its folder and the command that shows it."""
    return s.get("url") or " ".join(x for x in (s.get("dir"), s.get("command") and f"({s['command']})") if x)
