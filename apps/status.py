"""What the page says about a run's state, decided from plain values (pure; no gradio, no files):
the runs table's figures (s/step, ETA, best reward, held-out result), which controls are enabled,
when an old action message goes, and the evaluation's line.

>>> duration(3725)
'1h 02m'
>>> pace([{"step": s, "step_time": 2.0} for s in range(1, 5)])
2.0
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

LIVE = ("running", "starting")  # a training process is alive
PACE_WINDOW = 10  # s/step: the median step_time of the last this many steps


def num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


# --------------------------------------------------------------------------- the runs table's figures


def pace(rows: list[dict]) -> float | None:
    """Seconds per step: the median `step_time` of the last PACE_WINDOW metric rows (None before the first)."""
    times = [t for t in (num(r.get("step_time")) for r in rows[-PACE_WINDOW:]) if t is not None and t >= 0]
    return statistics.median(times) if times else None


def eta(status: str, step: int | None, steps: int | None, seconds_per_step: float | None) -> float | None:
    """Seconds until a live run reaches train.steps at its pace; None when it is not running or the pace is unknown.

    >>> eta("running", 10, 40, 2.0), eta("finished", 40, 40, 2.0), eta("running", 0, 40, None)
    (60.0, None, None)
    """
    if status not in LIVE or steps is None or seconds_per_step is None:
        return None
    return max(0, steps - (step or 0)) * seconds_per_step


def best(rows: list[dict], key: str = "reward_mean") -> tuple[float, int] | None:
    """(highest value, its step) of a metric; None before it was measured.

    >>> best([{"step": 1, "reward_mean": 0.2}, {"step": 2, "reward_mean": 0.5}, {"step": 3, "reward_mean": None}])
    (0.5, 2)
    """
    pts = [(v, r.get("step")) for r in rows if (v := num(r.get(key))) is not None]
    return max(pts, key=lambda p: p[0]) if pts else None


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def held_out(summary: dict | None, evaluation: dict, before: float | None = None) -> str:
    """The held-out result for the runs table: the run's own before -> after when it measured them
    (`before`: the figure the trainer logged, before summary.json has it), else the UI's newest
    evaluation that still describes its adapter.

    >>> held_out({"eval_before": 0.435, "eval_after": 0.7}, {"state": "done", "accuracy": 0.7})
    '43.5% → 70.0%'
    >>> held_out({"eval_before": 0.435, "interrupted": True}, {"state": "none"})
    '43.5% → n/a'
    >>> held_out(None, {"state": "done", "fresh_accuracy": 0.71})
    '71.0% (eval)'
    >>> held_out(None, {"state": "running"})
    'evaluating…'
    """
    s = summary or {}
    before = num(s.get("eval_before")) if s else before
    after = num(s.get("eval_after"))
    if evaluation.get("state") == "running":
        return "evaluating…"
    if after is not None:
        return f"{pct(before)} → {pct(after)}" if before is not None else pct(after)
    if evaluation.get("fresh_accuracy") is not None:
        return f"{pct(evaluation['fresh_accuracy'])} (eval)"
    if before is not None:
        return f"{pct(before)} → n/a"
    return ""


def duration(seconds: float | None) -> str:
    """A time span in words: 45s, 3m 20s, 1h 02m ('' when unknown)."""
    if seconds is None:
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def tracker_line(trackers: dict) -> str:
    """Where the run's experiment trackers show it (its tracker.json): a link where a tracker has a URL,
    else the command that opens its local files; '' for a run that reports to none.

    >>> tracker_line({"wandb": {"url": "https://wandb.ai/me/tinyrl/runs/abc"},
    ...               "tensorboard": {"dir": "r/tensorboard", "command": "tensorboard --logdir r/tensorboard"}})
    'trackers: [wandb](https://wandb.ai/me/tinyrl/runs/abc) · tensorboard: `tensorboard --logdir r/tensorboard`'
    >>> tracker_line({}), tracker_line({"x": {"url": "javascript:alert(1)"}})
    ('', '')
    """
    parts = []
    for name, s in trackers.items():
        s = s if isinstance(s, dict) else {}
        url, local = str(s.get("url") or ""), str(s.get("command") or s.get("dir") or "").replace("`", "'")
        if url.startswith(("https://", "http://")):
            parts.append(f"[{name}]({url})")
        elif local:
            parts.append(f"{name}: `{local}`")
    return "trackers: " + " · ".join(parts) if parts else ""


# --------------------------------------------------------------------------- controls and messages


@dataclass(frozen=True)
class Controls:
    """Which of the run's buttons work in its present state."""

    stop: bool
    resume: bool
    evaluate: bool
    download: bool


def controls(status: str, eval_running: bool, has_checkpoint: bool, has_adapter: bool) -> Controls:
    """Stop while training runs; Resume from a checkpoint when nothing runs; Evaluate and Download with an adapter.

    >>> controls("finished", False, True, True)
    Controls(stop=False, resume=True, evaluate=True, download=True)
    >>> controls("running", False, False, False)
    Controls(stop=True, resume=False, evaluate=False, download=False)
    """
    live = status in LIVE
    return Controls(stop=live, resume=has_checkpoint and not live and not eval_running,
                    evaluate=has_adapter and not eval_running, download=has_adapter)


def ended(before: tuple[str, str] | None, now: tuple[str, str]) -> bool:
    """Did a process of the run end between two looks? Each look is (run status, evaluation state).

    The page then drops the action message that process answered ("sent SIGTERM ...", "evaluating ...").

    >>> ended(("running", "none"), ("interrupted", "none")), ended(("finished", "running"), ("finished", "done"))
    (True, True)
    >>> ended(None, ("finished", "done")), ended(("starting", "none"), ("running", "none"))
    (False, False)
    """
    if before is None:
        return False
    return (before[0] in LIVE and now[0] not in LIVE) or (before[1] == "running" and now[1] != "running")


def eval_line(ev: dict) -> str:
    """The evaluation panel's words for `evals.status`: the newest evaluation, labelled when its adapter changed since.

    >>> eval_line({"state": "done", "result": "held-out accuracy (greedy pass@1): 70.0%", "adapter": "final adapter",
    ...            "at": "2026-12-06 07:15:00", "prompts": 200})
    '**evaluation** of the final adapter (started 2026-12-06 07:15:00): held-out accuracy (greedy pass@1): 70.0% on 200 prompts'
    >>> eval_line({"state": "done", "result": "held-out accuracy (greedy pass@1): 70.0%", "adapter": "final adapter",
    ...            "stale": "stale: the adapter changed after this evaluation"})[:62]
    '**stale: the adapter changed after this evaluation** — ~~evalu'
    """
    state = ev.get("state")
    if state == "none":
        return "no evaluation yet: **Evaluate adapter** measures held-out accuracy of the trained adapter"
    what = f"**evaluation** of the {ev.get('adapter') or 'adapter'}" + (f" (started {ev['at']})" if ev.get("at") else "")
    if state == "running":
        return f"{what}: running … the result appears here when it ends"
    if ev.get("result"):
        text = f"{what}: {ev['result']}" + (f" on {ev['prompts']} prompts" if ev.get("prompts") else "") + \
            (f"; {ev['sampled']}" if ev.get("sampled") else "")
        return f"**{ev['stale']}** — ~~{text.replace('**', '')}~~" if ev.get("stale") else text
    return f"{what}: ended without a result" + (f": `{ev['error']}`" if ev.get("error") else "; see its log in evals/")
