"""What the UI shows, read from run folders only (pure functions; no gradio, no state).

A run folder is the trainer's (`tinyrl/runs.py`): config.yaml, metrics.jsonl, samples.jsonl,
alarms.jsonl, resumes.jsonl, summary.json, checkpoints/step-*/, adapter/, and the trainer's `.lock`.
The UI adds `train.log` + `train.pid`, `launch.json` (what the form launched), `eval.pid` + `evals/`
(evals.py) and `export.pid` + `export.log` + `exports/` (exports.py) beside them. Until the trainer has made
the folder, a run the UI started lives in the runs directory's `.ui/` as `<name>.train.log` and
`<name>.train.pid`; the launcher moves both into the folder once training is under way.
The curves are drawn from `metrics()` and `alarms()` by charts.py; status.py decides the words;
runs_table.py puts a run's figures together.
"""

from __future__ import annotations

import json
import re
import time
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
    """Where a run still starting keeps its `kind.ext` file.

    >>> staging_file(Path("runs"), "r1", "train", "pid").as_posix()
    'runs/.ui/r1.train.pid'
    """
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


def run_config(run: Path) -> dict:
    try:
        data = yaml.safe_load((Path(run) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def metrics(run: Path) -> list[dict]:
    return [r for r in read_jsonl(Path(run) / "metrics.jsonl") if isinstance(r, dict) and "step" in r]



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


BEFORE = re.compile(rb"held-out accuracy before training: ([0-9.]+)")


def before_from_log(runs_dir: Path, name: str, head: int = 1_000_000) -> float | None:
    """Held-out accuracy before training as the trainer logged it (its first line), before summary.json has it."""
    try:
        with open(ui_file(runs_dir, name, "train", "log"), "rb") as f:
            m = BEFORE.search(f.read(head))
    except OSError:
        return None
    return float(m.group(1)) if m else None


def last_resume(run: Path) -> dict | None:
    """The newest record of resumes.jsonl (time, overrides, changed: {field: [before, after]}, step, checkpoint)."""
    rows = [r for r in read_jsonl(Path(run) / "resumes.jsonl") if isinstance(r, dict)]
    return rows[-1] if rows else None
