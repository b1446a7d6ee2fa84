"""The run report: metric curves summarised, the alarms that fired, and a one-line verdict.

`write_report(run_dir)` reads metrics.jsonl and alarms.jsonl (and summary.json when the run
finished), writes report.txt and metrics.png (reward, entropy, KL and length against step,
alarms marked) into the run folder, and returns the text. `tinyrl report RUN_DIR` prints it.
matplotlib is imported only here, on the Agg canvas (no display, no global backend switch);
without it the report says how to get the plot and skips it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tinyrl.errors import ConfigError
from tinyrl.runs import atomic_write_text, read_jsonl

# (metrics.jsonl key, label) rows of the summary table; absent keys are left out
SUMMARY = [
    ("reward_mean", "reward"),
    ("reward_group_std", "reward std in group"),
    ("zero_std_frac", "zero-std groups"),
    ("entropy", "entropy"),
    ("update_kl", "update KL (old->new)"),
    ("ref_kl", "KL to reference"),
    ("clip_frac", "clip fraction (loss)"),
    ("update_clip_frac", "moved past clip range"),
    ("grad_norm", "grad norm"),
    ("completion_len", "length (tokens)"),
    ("truncated_frac", "truncated"),
    ("logp_pos_mean", "logp of correct"),
    ("rollout_trainer_k3", "rollout-trainer k3"),
    ("step_time", "step time (s)"),
]

# panel title -> metrics.jsonl keys drawn in it
PANELS = {
    "reward": ["reward_mean"],
    "entropy": ["entropy", "entropy_p10", "entropy_p90"],
    "KL": ["update_kl", "ref_kl", "rollout_trainer_k3"],
    "length": ["completion_len"],
}


# partial rollouts' step metrics (tinyrl.collect): the "asynchronous rollouts" block appears when any is present
ASYNC_KEYS = ("staleness_mean", "staleness_max", "stale_dropped_groups", "carried_groups", "overlap_s")
HISTOGRAM = "staleness/"  # staleness/<lag>: share of a step's loss tokens sampled <lag> policy versions back


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows
           if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def summary_table(rows: list[dict]) -> list[str]:
    lines = [f"  {'metric':<20} {'first':>10} {'last':>10} {'min':>10} {'max':>10}"]
    for key, label in SUMMARY:
        steps, vals = _series(rows, key)
        if vals:
            lines.append(f"  {label:<20} {_fmt(vals[0]):>10} {_fmt(vals[-1]):>10} {_fmt(min(vals)):>10} "
                         f"{_fmt(max(vals)):>10}")
    return lines


def _trend(rows: list[dict], k: int = 5) -> tuple[float, float] | None:
    _, r = _series(rows, "reward_mean")
    if not r:
        return None
    k = max(1, min(k, len(r) // 2 or 1))
    return sum(r[:k]) / k, sum(r[-k:]) / k


def _move(start: float, end: float, tol: float = 0.02) -> str:
    return "rose" if end > start + tol else "fell" if end < start - tol else "stayed flat"


def verdict(rows: list[dict], alarms: list[dict], summary: dict | None = None) -> str:
    """One line: stopped / failed / healthy / needs a look, with the reward trend.

    Progress is judged on held-out accuracy where the run measured it before and after (the
    number a run is for: a sparse reward can stay flat while the greedy policy improves, and a
    reward can rise on what does not transfer), else on the training reward's trend."""
    if not rows:
        return "verdict: NO DATA - metrics.jsonl has no steps yet"
    fatal = [a for a in alarms if a.get("fatal")]
    if fatal:
        a = fatal[0]
        return f"verdict: STOPPED - {a['name']} at step {a['step']}: {a['action']}"
    if summary and summary.get("error"):
        return f"verdict: FAILED at step {summary.get('steps')} - {summary['error']}"
    start, end = _trend(rows) or (float("nan"), float("nan"))
    move = _move(start, end)
    trend = f"reward {move} ({start:.3f} -> {end:.3f})"
    progress = move
    if summary and summary.get("eval_before") is not None and summary.get("eval_after") is not None:
        before, after = summary["eval_before"], summary["eval_after"]
        progress = _move(before, after)
        trend += f", held-out accuracy {progress} ({before:.1%} -> {after:.1%})"
    real = [a for a in alarms if a.get("severity", "alarm") == "alarm"]  # warnings are notices, not failures
    notes = sorted({a["name"] for a in alarms if a not in real})
    noted = f"; warnings: {', '.join(notes)}" if notes else ""
    if not real:
        state = "HEALTHY" if progress == "rose" else "NO PROGRESS"
        return f"verdict: {state} - {trend}; no alarms{noted}"
    names = sorted({a["name"] for a in real})
    return f"verdict: NEEDS A LOOK - {trend}; {len(real)} alarm(s): {', '.join(names)}{noted}"


def plot(rows: list[dict], alarms: list[dict], path: Path) -> bool:
    """metrics.png: one panel per PANELS entry, alarms as dashed lines. False without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(10, 7), dpi=100)
    FigureCanvasAgg(fig)
    for i, (title, keys) in enumerate(PANELS.items()):
        ax = fig.add_subplot(2, 2, i + 1)
        for key in keys:
            steps, vals = _series(rows, key)
            if vals:
                ax.plot(steps, vals, label=key, marker="." if len(vals) < 40 else None)
        for a in alarms:
            ax.axvline(a["step"], color="red" if a.get("fatal") else "orange", ls="--", lw=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
        if any(not line.get_label().startswith("_") for line in ax.lines):
            ax.legend(fontsize=7)
    if alarms:
        fig.suptitle("alarms: " + ", ".join(f"{a['name']}@{a['step']}" for a in alarms[:6]), fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    tmp.replace(path)
    return True


def _lags(rows: list[dict]) -> list[int]:
    return sorted({int(k[len(HISTOGRAM):]) for r in rows for k in r
                   if k.startswith(HISTOGRAM) and k[len(HISTOGRAM):].isdigit()})


def async_lines(rows: list[dict]) -> list[str]:
    """Partial rollouts (rollout.max_staleness > 0): staleness, its histogram, groups dropped and carried,
    overlap, and the behaviour weights' statistics; nothing for a synchronous run (no staleness metrics)."""
    if not any(_series(rows, k)[1] for k in ASYNC_KEYS) and not _lags(rows):
        return []
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    out = ["", "asynchronous rollouts:"]
    _, lag = _series(rows, "staleness_mean")
    _, top = _series(rows, "staleness_max")
    if lag:
        most = f" (max {max(top):g})" if top else ""
        out.append(f"  {'mean staleness':<26} {_fmt(mean(lag))} policy versions{most}")
    hist = [(k, _series(rows, f"{HISTOGRAM}{k}")[1]) for k in _lags(rows)]
    if hist:
        cells = "  ".join(f"lag {k}: {mean(v):.0%}" for k, v in hist if v)
        out.append(f"  {'staleness histogram':<26} {cells}  (share of loss tokens, mean over steps)")
    for key, label in (("stale_dropped_groups", "groups dropped (stale)"), ("carried_groups", "groups carried over"),
                       ("overlap_s", "generation overlap (s)")):
        _, v = _series(rows, key)
        if v:
            out.append(f"  {label:<26} {_fmt(sum(v))} in all, {_fmt(mean(v))} per step")
    for key, label, unit in (("offpolicy_ess", "behaviour weights ESS", ""),
                             ("offpolicy_capped_frac", "weights above the cap", " of tokens"),
                             ("rollout_trainer_k3", "behaviour-trainer KL (k3)", " per token")):
        _, v = _series(rows, key)
        if v:
            out.append(f"  {label:<26} {_fmt(mean(v))}{unit} mean (min {_fmt(min(v))}, max {_fmt(max(v))})")
    return out


def sampled_lines(summary: dict | None) -> list[str]:
    """pass@k / maj@k before and after training (summary.json details.eval_sampled, train.eval_samples)."""
    got = ((summary or {}).get("details") or {}).get("eval_sampled") or {}
    if not got:
        return []
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    first = next(iter(got.values()))
    out = ["", f"held-out pass@k / maj@k ({first['samples']} samples per prompt at temperature "
               f"{first['temperature']:g}):"]
    for when in ("before", "after"):
        if got.get(when):
            cells = [f"pass@{k} {pct(v)}" for k, v in got[when]["pass@k"].items()]
            cells += [f"maj@{k} {pct(v)}" for k, v in (got[when]["maj@k"] or {}).items()]
            out.append(f"  {when:<7} " + "  ".join(cells))
    if first.get("maj_note"):
        out.append(f"  maj@k left out: {first['maj_note']}")
    return out


def render(run_dir: Path, rows: list[dict], alarms: list[dict], summary: dict | None, png: bool) -> str:
    steps = [r["step"] for r in rows]
    lines = [f"tinyrl run report: {run_dir}"]
    lines.append(f"steps: {len(rows)}" + (f" ({steps[0]}..{steps[-1]})" if steps else ""))
    if rows:
        lines += ["", "metrics:", *summary_table(rows)]
    lines += async_lines(rows)
    lines += sampled_lines(summary)
    lines += ["", f"alarms ({len(alarms)}):" if alarms else "alarms: none"]
    for a in alarms:
        auto = f" [auto: {a['applied']}]" if a.get("applied") else ""
        kind = " (fatal)" if a.get("fatal") else " (warning)" if a.get("severity") == "warning" else ""
        lines.append(f"  step {a['step']:>4}  {a['name']}{kind}: {a['evidence']}")
        lines.append(f"             suggested: {a['action']}{auto}")
    lines += ["", f"plot: {run_dir / 'metrics.png'}" if png else "plot: skipped (pip install 'tinyrl-rlvr[plot]' for metrics.png)"]
    lines.append(verdict(rows, alarms, summary))
    return "\n".join(lines) + "\n"


def write_report(run_dir) -> str:
    """Write report.txt and metrics.png into `run_dir`; return the report text."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"tinyrl report: {run_dir} is not a run folder")
    if not any((run_dir / f).is_file() for f in ("config.yaml", "metrics.jsonl", "summary.json")):
        raise ConfigError(f"RUN_DIR {run_dir}: not a tinyrl run folder (no config.yaml, metrics.jsonl or "
                          f"summary.json); nothing is written into it")
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "step" in r]
    alarms = read_jsonl(run_dir / "alarms.jsonl")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    png = bool(rows) and plot(rows, alarms, run_dir / "metrics.png")
    text = render(run_dir, rows, alarms, summary, png)
    atomic_write_text(run_dir / "report.txt", text)
    return text
