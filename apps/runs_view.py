"""What the UI shows, read from run folders only (pure functions; no gradio, no state).

A run folder is the trainer's (`tinyrl/runs.py`): config.yaml, metrics.jsonl, samples.jsonl,
alarms.jsonl, summary.json, checkpoints/step-*/, adapter/, and the trainer's `.lock`. The UI adds
`train.log` + `train.pid` (and `eval.log` + `eval.pid`) beside them. Until the trainer has made
the folder, a run the UI started lives in the runs directory's `.ui/` as `<name>.train.log` and
`<name>.train.pid`; the launcher moves both into the folder once training is under way.
The curves are drawn from `metrics()` and `alarms()` by charts.py; status.py decides the words.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from tinyrl.apps import procs
from tinyrl.apps import status as st
from tinyrl.apps.paths import inside
from tinyrl.runs import CKPT_PREFIX, read_jsonl

UI_DIR = ".ui"  # inside the runs directory: logs and pid files of runs whose folder does not exist yet
STATUSES = ("starting", "running", "finished", "failed", "interrupted")



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
    return sorted(names, key=lambda n: started(root, n), reverse=True)


_BANNER = re.compile(rb"^=== tinyrl ui: train at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
_STAMP = "%Y-%m-%d %H:%M:%S"


def _parse_time(text: str | None) -> float | None:
    try:
        return time.mktime(time.strptime(text or "", _STAMP))
    except ValueError:
        return None


def started(runs_dir: Path, name: str) -> float:
    """When the run's first process started (0.0 when unknown); a resume does not move it.

    The UI's train.log opens with the banner of the first start. Without one (a run started by
    `tinyrl train`), the earliest time the folder records: config.yaml is rewritten by each resume,
    and resumes.jsonl's first record dates the first of them."""
    root = Path(runs_dir)
    try:
        with open(ui_file(root, name, "train", "log"), "rb") as f:
            m = _BANNER.match(f.readline(200))
        if m and (t := _parse_time(m.group(1).decode())):
            return t
    except OSError:
        pass
    times = [p.stat().st_mtime for p in (root / name / "config.yaml", staging_file(root, name, "train", "pid"))
             if p.exists()]
    first = next(iter(read_jsonl(root / name / "resumes.jsonl")), None)
    if isinstance(first, dict) and (t := _parse_time(first.get("time"))):
        times.append(t)
    return min(times, default=0.0)


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


def adapter_dir(run: Path) -> Path | None:
    """The run's final adapter, else the adapter of its latest checkpoint (None before either exists;
    one that resolves outside the run folder, through a symlink, does not count)."""
    run = Path(run)
    for c in [run / "adapter"] + [c / "adapter" for c in reversed(checkpoints(run))]:
        if (c / "adapter_config.json").is_file() and inside(c, run):
            return c
    return None


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


TABLE_HEADERS = ["run", "status", "step", "reward", "best reward", "s/step", "ETA", "held-out", "started"]


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
    steps = steps if isinstance(steps, int) and not isinstance(steps, bool) else None
    t0, state = started(Path(runs_dir), name), status(runs_dir, name)
    best, pace = st.best(rows), st.pace(rows)
    return RunInfo(name=name, status=state, step=last.get("step"), steps=steps,
                   reward=st.num(last.get("reward_mean")),
                   started=time.strftime(_STAMP, time.localtime(t0)) if t0 else "",
                   description=str(cfg.get("description") or ""),
                   best_reward=best and best[0], best_step=best and best[1], seconds_per_step=pace,
                   eta_s=st.eta(state, last.get("step"), steps, pace),
                   held_out=st.held_out(read_json(run / "summary.json"), eval_status(runs_dir, name)))


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


def tracker_text(run: Path) -> str:
    """Links to the run's experiment trackers (log.report_to), from its tracker.json; '' when none."""
    return st.tracker_line(read_json(Path(run) / "tracker.json") or {})


def accuracy_text(run: Path) -> str:
    """Held-out accuracy before/after from summary.json, in words."""
    s = read_json(Path(run) / "summary.json")
    if not s:
        return "held-out accuracy: not measured yet (summary.json is written when the run ends)"
    b, a = st.num(s.get("eval_before")), st.num(s.get("eval_after"))
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


EVAL_BANNER = "=== tinyrl ui: eval "
ACCURACY = re.compile(r"^held-out accuracy \(greedy pass@1\): ([0-9.]+)%")


def eval_status(runs_dir: Path, name: str) -> dict:
    """The last `tinyrl eval` the UI started for this run (eval.log from its last banner on):
    state (none / running / done), the adapter and start time, its accuracy line, or its error."""
    log = Path(runs_dir) / name / "eval.log"
    if not log.exists():
        return {"state": "none", "result": None}
    section = log_tail(log, lines=400).rsplit(EVAL_BANNER, 1)
    lines = section[-1].splitlines()
    adapter, _, at = (lines[0] if len(section) > 1 and lines else "").strip().partition(" at ")
    out = {"state": "running" if procs.alive(process(runs_dir, name, "eval")) else "done", "result": None,
           "accuracy": None, "prompts": None, "error": None, "adapter": adapter or None, "at": at or None}
    for i, line in enumerate(lines):
        if m := ACCURACY.match(line):
            out.update(result=line.strip(), accuracy=float(m.group(1)) / 100, error=None)
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if nxt.startswith("prompts:") and nxt.split(":")[1].strip().isdigit():
                out["prompts"] = int(nxt.split(":")[1])
        elif line.startswith("tinyrl: error"):
            out["error"] = line.strip()
    if out["result"] is None and out["error"] is None and "Traceback" in section[-1]:
        out["error"] = next((ln.strip() for ln in reversed(lines) if ln.strip()), None)  # the exception's line
    return out
