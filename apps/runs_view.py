"""What the UI shows, read from run folders only (pure functions; no gradio, no state).

A run folder is the trainer's (`tinyrl/runs.py`): config.yaml, metrics.jsonl, samples.jsonl,
alarms.jsonl, summary.json, checkpoints/step-*/, adapter/, and the trainer's `.lock`. The UI adds
`train.log` + `train.pid` (and `eval.log` + `eval.pid`) beside them. Until the trainer has made
the folder, a run the UI started lives in the runs directory's `.ui/` as `<name>.train.log` and
`<name>.train.pid`; the launcher moves both into the folder once training is under way.

Metric rows may lack any key or carry null (a quantity that was not measured): such points are
left out, never drawn as 0.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from tinyrl.apps import procs
from tinyrl.runs import CKPT_PREFIX, read_jsonl

UI_DIR = ".ui"  # inside the runs directory: logs and pid files of runs whose folder does not exist yet
STATUSES = ("starting", "running", "finished", "failed", "interrupted")

# Curve panels: title -> metric keys drawn on it ("reward/*" = every reward component present).
PANELS: dict[str, tuple[str, ...]] = {
    "reward": ("reward_mean", "reward/*"),
    "entropy": ("entropy",),
    "KL": ("update_kl", "ref_kl", "pass_kl"),
    "completion length": ("completion_len",),
    "zero-std fraction": ("zero_std_frac",),
    "clip fraction": ("clip_frac", "update_clip_frac"),
    "step time (s)": ("step_time", "gen_time"),
    "agent": ("tool_calls_per_traj", "turns_mean", "max_turns_frac", "obs_token_frac", "tool_error_rate"),
}


# --------------------------------------------------------------------------- where things are


def staging_file(runs_dir: Path, name: str, kind: str, ext: str) -> Path:
    return Path(runs_dir) / UI_DIR / f"{name}.{kind}.{ext}"


def ui_file(runs_dir: Path, name: str, kind: str, ext: str) -> Path:
    """`<run>/<kind>.<ext>` once it is there, else its place in `.ui/` (a run still starting)."""
    in_run = Path(runs_dir) / name / f"{kind}.{ext}"
    staged = staging_file(runs_dir, name, kind, ext)
    return staged if staged.exists() and not in_run.exists() else in_run


def process(runs_dir: Path, name: str, kind: str = "train") -> dict | None:
    """The pid record of the run's `kind` process: the UI's pid file, else the trainer's `.lock`."""
    info = procs.read_pidfile(ui_file(runs_dir, name, kind, "pid"))
    if info is None and kind == "train":
        info = procs.read_pidfile(Path(runs_dir) / name / ".lock")
    return info


def run_names(runs_dir: Path) -> list[str]:
    """Run folders (those with a config.yaml) and runs still starting (only a pid file in `.ui/`), newest first."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    names = {p.name for p in root.iterdir() if not p.name.startswith(".") and (p / "config.yaml").is_file()}
    staged = root / UI_DIR
    if staged.is_dir():
        names |= {p.name[: -len(".train.pid")] for p in staged.glob("*.train.pid")}
    return sorted(names, key=lambda n: _started(root, n), reverse=True)


def _started(root: Path, name: str) -> float:
    for p in (root / name / "config.yaml", staging_file(root, name, "train", "pid")):
        if p.exists():
            return p.stat().st_mtime
    return 0.0


# --------------------------------------------------------------------------- status


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def checkpoints(run: Path) -> list[Path]:
    d = Path(run) / "checkpoints"
    return sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX)) if d.is_dir() else []


def status(runs_dir: Path, name: str) -> str:
    """running / starting (alive, no metrics yet) / finished / failed / interrupted.

    A process that died without writing summary.json (kill -9, out of memory) counts as
    interrupted when a checkpoint can resume it, failed otherwise."""
    run = Path(runs_dir) / name
    if procs.alive(process(runs_dir, name)):
        return "running" if (run / "metrics.jsonl").exists() else "starting"
    summary = read_json(run / "summary.json")
    if summary is not None:
        if summary.get("interrupted"):
            return "interrupted"
        return "failed" if summary.get("error") else "finished"
    return "interrupted" if checkpoints(run) else "failed"


@dataclass
class RunInfo:
    name: str
    status: str
    step: int | None  # last step in metrics.jsonl
    steps: int | None  # train.steps of the run's config
    reward: float | None  # last reward_mean
    started: str
    description: str

    def row(self) -> list:
        frac = f"{self.step or 0}/{self.steps}" if self.steps is not None else str(self.step or 0)
        reward = "" if self.reward is None else f"{self.reward:.3f}"
        return [self.name, self.status, frac, reward, self.started]


TABLE_HEADERS = ["run", "status", "step", "reward", "started"]


def run_config(run: Path) -> dict:
    try:
        data = yaml.safe_load((Path(run) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def metrics(run: Path) -> list[dict]:
    return [r for r in read_jsonl(Path(run) / "metrics.jsonl") if isinstance(r, dict) and "step" in r]


def info(runs_dir: Path, name: str) -> RunInfo:
    run = Path(runs_dir) / name
    cfg = run_config(run)
    rows = metrics(run)
    last = rows[-1] if rows else {}
    steps = (cfg.get("train") or {}).get("steps") if isinstance(cfg.get("train"), dict) else None
    started = _started(Path(runs_dir), name)
    return RunInfo(name=name, status=status(runs_dir, name), step=last.get("step"), steps=steps,
                   reward=_num(last.get("reward_mean")),
                   started=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "",
                   description=str(cfg.get("description") or ""))


def list_runs(runs_dir: Path) -> list[RunInfo]:
    return [info(runs_dir, n) for n in run_names(runs_dir)]


def info_dict(runs_dir: Path, name: str) -> dict:
    """Everything a script (or a test) wants to know about one run, JSON-ready."""
    run = Path(runs_dir) / name
    out = asdict(info(runs_dir, name))
    out.update(checkpoints=[p.name for p in checkpoints(run)], adapter=(run / "adapter").is_dir(),
               metric_rows=len(metrics(run)), alarms=[a.get("name") for a in alarms(run)],
               summary=read_json(run / "summary.json"), eval=eval_status(runs_dir, name))
    return out


# --------------------------------------------------------------------------- curves


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _keys(panel: tuple[str, ...], rows: list[dict]) -> list[str]:
    keys = []
    for k in panel:
        if k.endswith("/*"):
            prefix = k[:-1]
            keys += sorted({key for r in rows for key in r if key.startswith(prefix)})
        else:
            keys.append(k)
    return keys


def curve_points(rows: list[dict], panel: tuple[str, ...]) -> list[dict]:
    """Long-format points {step, value, series} for one panel; absent or null values are skipped.

    >>> curve_points([{"step": 1, "entropy": 0.5}, {"step": 2, "entropy": None}, {"step": 3}], ("entropy",))
    [{'step': 1, 'value': 0.5, 'series': 'entropy'}]
    """
    out = []
    for key in _keys(panel, rows):
        for r in rows:
            v, step = _num(r.get(key)), r.get("step")
            if v is not None and isinstance(step, int):
                out.append({"step": step, "value": v, "series": key})
    return out


def curves(runs_dir: Path, names: list[str]) -> dict[str, list[dict]]:
    """Panel title -> points of every named run (series labelled by run when there are several)."""
    rows = {name: metrics(Path(runs_dir) / name) for name in names}
    out: dict[str, list[dict]] = {}
    for title, panel in PANELS.items():
        points = {name: curve_points(r, panel) for name, r in rows.items()}
        if len(names) == 1:
            out[title] = points[names[0]]
            continue
        # several runs: a panel that draws one metric names series by run, otherwise by run and metric
        one_metric = len({p["series"] for pts in points.values() for p in pts}) <= 1
        out[title] = [{**p, "series": name if one_metric else f"{name} · {p['series']}"}
                      for name, pts in points.items() for p in pts]
    return out


# --------------------------------------------------------------------------- the rest of the folder


def alarms(run: Path) -> list[dict]:
    return [a for a in read_jsonl(Path(run) / "alarms.jsonl") if isinstance(a, dict)]


ALARM_HEADERS = ["step", "alarm", "evidence", "suggested fix", "auto-action"]


def alarm_rows(run: Path) -> list[list]:
    return [[a.get("step"), a.get("name"), a.get("evidence", ""), a.get("action", ""), a.get("applied") or ""]
            for a in alarms(run)]


def latest_samples(run: Path, limit: int = 8) -> tuple[list[str], list[list]]:
    """(headers, rows) of the last step's samples: prompt, completion, reward, reward/<component>..."""
    samples = [s for s in read_jsonl(Path(run) / "samples.jsonl") if isinstance(s, dict)]
    if not samples:
        return ["step", "prompt", "completion", "reward"], []
    last = samples[-1].get("step")
    batch = [s for s in samples if s.get("step") == last][:limit]
    comps = sorted({k for s in batch for k in s if k.startswith("reward/")})
    headers = ["step", "prompt", "completion", "reward", *comps]
    extra = sorted({k for s in batch for k in s} - set(headers))
    return headers + extra, [[_cell(s.get(h)) for h in headers + extra] for s in batch]


def _cell(v):
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return json.dumps(v, default=str)


def accuracy_text(run: Path) -> str:
    """Held-out accuracy before/after from summary.json, in words."""
    s = read_json(Path(run) / "summary.json")
    if not s:
        return "held-out accuracy: not measured yet (summary.json is written when the run ends)"
    b, a = _num(s.get("eval_before")), _num(s.get("eval_after"))
    if b is None and a is None:
        return "held-out accuracy: not measured in this run (train.eval_before_after=false or no verifier)"
    fmt = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    text = f"held-out accuracy (greedy pass@1): before {fmt(b)} → after {fmt(a)}"
    if a is not None and b is not None:
        text += f" ({100 * (a - b):+.1f} points)"
    return text + (f"; error: {s['error']}" if s.get("error") else "")


def log_tail(path: Path, lines: int = 60, max_bytes: int = 256_000) -> str:
    """The last lines of a log, with progress-bar redraws (\\r) collapsed to their final state."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    out = []
    for line in data.split("\n"):  # not splitlines(): it splits at each \r too
        parts = [p for p in line.split("\r") if p.strip()]
        if parts:
            out.append(parts[-1])
    return "\n".join(out[-lines:])


def eval_status(runs_dir: Path, name: str) -> dict:
    """The last `tinyrl eval` of this run: running or not, its accuracy line, where its log is."""
    log = Path(runs_dir) / name / "eval.log"
    tail = log_tail(log, lines=400)
    if not log.exists():
        return {"state": "none", "result": None}
    last = tail.rsplit("=== tinyrl ui: eval", 1)[-1]
    result = next((ln.strip() for ln in reversed(last.splitlines()) if "held-out accuracy" in ln or "error" in ln), None)
    running = procs.alive(process(runs_dir, name, "eval"))
    return {"state": "running" if running else "done", "result": result}
