"""A run's figures as the runs table, the API and the Runs tab's status lines show them (pure reads).

The held-out result is the run's own before -> after (summary.json; before the run ends, the before
figure the trainer logged), else the UI's newest evaluation that still describes the adapter it names.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tinyrl.apps import evals, runs_view
from tinyrl.apps import status as st

TABLE_HEADERS = ["run", "status", "step", "reward", "best reward", "s/step", "ETA", "held-out", "started"]


@dataclass
class RunInfo:
    name: str
    status: str
    step: int | None  # last step in metrics.jsonl
    steps: int | None  # train.steps of the run's config
    reward: float | None  # last reward_mean
    started: str
    description: str
    best_reward: float | None = None  # highest reward_mean so far
    best_step: int | None = None
    seconds_per_step: float | None = None  # median step_time of the last steps
    eta_s: float | None = None  # seconds to train.steps at that pace (live runs only)
    held_out: str = ""  # held-out accuracy: the run's before -> after, else the UI's last evaluation

    def row(self) -> list:
        """The runs table's row (TABLE_HEADERS).

        >>> RunInfo("r", "running", 2, 4, 0.5, "2026-12-06 07:14:57", "", 0.75, 1, 2.0, 4.0, "").row()
        ['r', 'running', '2/4', '0.500', '0.750 (step 1)', '2.00', '4s', '', '2026-12-06 07:14:57']
        """
        frac = f"{self.step or 0}/{self.steps}" if self.steps is not None else str(self.step or 0)
        reward = "" if self.reward is None else f"{self.reward:.3f}"
        best = "" if self.best_reward is None else f"{self.best_reward:.3f} (step {self.best_step})"
        pace = "" if self.seconds_per_step is None else f"{self.seconds_per_step:.2f}"
        return [self.name, self.status, frac, reward, best, pace, st.duration(self.eta_s), self.held_out, self.started]


def _steps(cfg: dict) -> int | None:
    steps = (cfg.get("train") or {}).get("steps") if isinstance(cfg.get("train"), dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def info(runs_dir: Path, name: str) -> RunInfo:
    run = Path(runs_dir) / name
    cfg = runs_view.run_config(run)
    rows = runs_view.metrics(run)
    last = rows[-1] if rows else {}
    steps = _steps(cfg)
    t0, state = runs_view.started(Path(runs_dir), name), runs_view.status(runs_dir, name)
    best, pace = st.best(rows), st.pace(rows)
    summary = runs_view.read_json(run / "summary.json")
    before = None if summary else runs_view.before_from_log(runs_dir, name)
    return RunInfo(name=name, status=state, step=last.get("step"), steps=steps,
                   reward=st.num(last.get("reward_mean")),
                   started=time.strftime(runs_view._STAMP, time.localtime(t0)) if t0 else "",
                   description=str(cfg.get("description") or ""),
                   best_reward=best and best[0], best_step=best and best[1], seconds_per_step=pace,
                   eta_s=st.eta(state, last.get("step"), steps, pace),
                   held_out=st.held_out(summary, evals.status(runs_dir, name), before))


def list_runs(runs_dir: Path) -> list[RunInfo]:
    return [info(runs_dir, n) for n in runs_view.run_names(runs_dir)]


def info_dict(runs_dir: Path, name: str) -> dict:
    """Everything a script (or a test) wants to know about one run, JSON-ready."""
    run = Path(runs_dir) / name
    out = asdict(info(runs_dir, name))
    out.update(checkpoints=[p.name for p in runs_view.checkpoints(run)], adapter=(run / "adapter").is_dir(),
               metric_rows=len(runs_view.metrics(run)), alarms=[a.get("name") for a in runs_view.alarms(run)],
               summary=runs_view.read_json(run / "summary.json"), eval=evals.status(runs_dir, name),
               evals=evals.table(evals.records(runs_dir, name)))
    return out


def accuracy_text(runs_dir: Path, name: str) -> str:
    """Held-out accuracy before / after in words: summary.json's, else what the trainer logged so far."""
    run = Path(runs_dir) / name
    s = runs_view.read_json(run / "summary.json")
    state = runs_view.status(runs_dir, name)
    if not s:
        train = runs_view.run_config(run).get("train") or {}
        if isinstance(train, dict) and train.get("eval_before_after") is False:
            return "held-out accuracy: not measured in this run (train.eval_before_after=false)"
        b = runs_view.before_from_log(runs_dir, name)
        before = f"before {st.pct(b)}" if b is not None else "before: not measured"
        after = {"running": "after: measured when the run ends", "starting": "after: measured when the run ends",
                 "failed": "after: none (the run failed; see the log)",
                 "interrupted": "after: none (the run stopped early; Resume finishes it)"}.get(state, "after: n/a")
        if b is None and state in st.LIVE:
            return "held-out accuracy (greedy pass@1): measured before the first step and after the last"
        return f"held-out accuracy (greedy pass@1): {before}; {after}"
    b, a = st.num(s.get("eval_before")), st.num(s.get("eval_after"))
    if b is None and a is None:
        return "held-out accuracy: not measured in this run (train.eval_before_after=false or no verifier)"
    text = f"held-out accuracy (greedy pass@1): before {st.pct(b)} → after {st.pct(a)}"
    if a is not None and b is not None:
        text += f" ({100 * (a - b):+.1f} points)"
    elif a is None and s.get("interrupted"):
        text += " (stopped before the final evaluation; Resume finishes it)"
    return text + (f"; error: {s['error']}" if s.get("error") else "")


def resume_text(run: Path) -> str:
    """What the newest resume changed, in words ('' for a run never resumed).

    >>> import tempfile, json, pathlib
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (run / "resumes.jsonl").write_text(json.dumps({"time": "t", "changed": {"train.steps": [12, 14]}}))
    >>> resume_text(run)
    'resumed at t: changed train.steps 12 → 14'
    """
    r = runs_view.last_resume(run)
    if r is None:
        return ""
    changed = r.get("changed") or {}
    where = f" from step {r['step']}" if isinstance(r.get("step"), int) else ""
    what = "changed " + "; ".join(f"{k} {_v(v[0])} → {_v(v[1])}" for k, v in changed.items()) if changed \
        else "nothing changed in the config"
    return f"resumed at {r.get('time', '?')}{where}: {what}"


def _v(x) -> str:
    return "null" if x is None else str(x)
