"""Evaluations the UI ran, kept per (adapter, settings) and checked against the adapter as it is now (pure).

Each `tinyrl eval` the UI starts gets a record in `<run>/evals/`: `<id>.json` (which adapter, its
fingerprint when the evaluation started, the settings: held-out prompts, samples per prompt, the k of
pass@k / maj@k) and `<id>.log` (the command's output, from which the result is read). One evaluation
of a run runs at a time (`<run>/eval.pid`). A result is *stale* when its adapter folder has been
rewritten since (a resume trained on: `adapter/` is saved again) and *gone* when the checkpoint it
measured was removed (train.keep_last); both stay listed, labelled so.

>>> parse("held-out accuracy (greedy pass@1): 70.0%\\n  prompts: 20\\nsampled: 4 per prompt at temperature 1\\n"
...       "  pass@1:  40.0%   maj@1:  40.0%\\n  pass@4:  75.0%   maj@4:  55.0%\\n")["pass"]
{1: 0.4, 4: 0.75}
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from tinyrl.apps import adapters, procs, runs_view
from tinyrl.runs import atomic_write_text

DIR = "evals"
ACCURACY = re.compile(r"^held-out accuracy \(greedy pass@1\): ([0-9.]+)%")
PROMPTS = re.compile(r"^\s+prompts: (\d+)")
SAMPLED = re.compile(r"^sampled: (\d+) per prompt at temperature ([0-9.e+-]+)")
PASS = re.compile(r"^\s+pass@(\d+):\s+([0-9.]+)%(?:\s+maj@\d+:\s+([0-9.]+)%)?")
HEADERS = ["adapter", "prompts", "samples", "greedy pass@1", "pass@k", "maj@k", "started", "state"]


def command(run: Path, adapter: Path, samples: int, ks: list[int], prompts: int | None) -> list[str]:
    """`tinyrl eval <run>/config.yaml [data.num_eval=M] --adapter A [--samples N --k ...]`."""
    cmd = [sys.executable, "-m", "tinyrl.cli", "eval", str(run / "config.yaml")]
    cmd += [f"data.num_eval={int(prompts)}"] if prompts else []
    # a run folder for its final adapter, else the checkpoint folder: eval-*.json goes beside it, not into it
    cmd += ["--adapter", str(run if adapter == run / "adapter" else adapter.parent)]
    return cmd + (["--samples", str(int(samples)), "--k", *map(str, ks)] if samples else [])


def new_record(run: Path, key: str, adapter: Path, samples: int, ks: list[int], prompts: int | None) -> dict:
    """Write the record of an evaluation about to start; its log goes to `log_path(run, record)`."""
    folder = Path(run) / DIR
    folder.mkdir(exist_ok=True)
    stamp = rid = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1, 1000):
        if not (folder / f"{rid}.json").exists():
            break
        rid = f"{stamp}-{i:03d}"
    rec = {"id": rid, "adapter": key, "path": str(adapter.relative_to(run)), "fingerprint": adapters.fingerprint(adapter),
           "samples": int(samples), "k": list(ks) if samples else [], "prompts": int(prompts) if prompts else None,
           "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    atomic_write_text(folder / f"{rid}.json", json.dumps(rec))
    return rec


def log_path(run: Path, rec: dict) -> Path:
    return Path(run) / DIR / f"{rec['id']}.log"


def parse(text: str) -> dict:
    """The result in an evaluation's output: greedy accuracy, prompts, pass@k and maj@k by k, or its error."""
    out = {"accuracy": None, "prompts": None, "pass": {}, "maj": {}, "temperature": None, "error": None}
    for line in text.splitlines():
        if m := ACCURACY.match(line):
            out["accuracy"] = float(m.group(1)) / 100
        elif (m := PROMPTS.match(line)) and out["accuracy"] is not None and out["prompts"] is None:
            out["prompts"] = int(m.group(1))
        elif m := SAMPLED.match(line):
            out["temperature"] = float(m.group(2))
        elif m := PASS.match(line):
            out["pass"][int(m.group(1))] = float(m.group(2)) / 100
            if m.group(3) is not None:
                out["maj"][int(m.group(1))] = float(m.group(3)) / 100
        elif line.startswith("tinyrl: error"):
            out["error"] = line.strip()
    if out["accuracy"] is None and out["error"] is None and "Traceback" in text:
        out["error"] = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), None)
    return out


def records(runs_dir: Path, name: str) -> list[dict]:
    """Every evaluation of the run, newest first: its record, result, state (running / done) and `stale`
    (None, or why the result no longer describes the adapter it names)."""
    run = Path(runs_dir) / name
    folder = run / DIR
    metas = sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []
    running = procs.alive(runs_view.process(runs_dir, name, "eval"))
    out = []
    for i, meta in enumerate(metas):
        rec = runs_view.read_json(meta)
        if rec is None or "id" not in rec:
            continue
        rec.update(parse(runs_view.log_tail(log_path(run, rec), lines=400)))
        rec["state"] = "running" if running and i == 0 else "done"
        rec["stale"] = stale_reason(run, rec)
        out.append(rec)
    return out


def stale_reason(run: Path, rec: dict) -> str | None:
    path = Path(run) / rec.get("path", "")
    if not (path / "adapter_config.json").is_file():
        return "gone: that checkpoint was removed (train.keep_last)"
    if adapters.fingerprint(path) != rec.get("fingerprint"):
        return "stale: the adapter changed after this evaluation (the run trained on)"
    return None


def settings_key(rec: dict) -> tuple:
    return rec.get("path"), rec.get("fingerprint"), rec.get("samples"), tuple(rec.get("k") or ()), rec.get("prompts")


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def table(recs: list[dict]) -> list[list]:
    """One row per (adapter, settings), its newest evaluation (HEADERS)."""
    rows, seen = [], set()
    for r in recs:
        if settings_key(r) in seen:
            continue
        seen.add(settings_key(r))
        state = r["state"] if r["state"] == "running" else (
            r["error"] if r["error"] else r["stale"] or ("current" if r["accuracy"] is not None else "no result"))
        rows.append([adapters.label_of(r.get("adapter", "")), r.get("prompts") or "all",
                     r.get("samples") or "greedy only", pct(r["accuracy"]),
                     " · ".join(f"pass@{k} {pct(v)}" for k, v in sorted(r["pass"].items())),
                     " · ".join(f"maj@{k} {pct(v)}" for k, v in sorted(r["maj"].items())), r.get("at", ""), state])
    return rows


def status(runs_dir: Path, name: str) -> dict:
    """The newest evaluation in the words of status.eval_line / status.held_out (state none / running / done)."""
    recs = records(runs_dir, name)
    if not recs:
        return {"state": "none", "result": None, "accuracy": None}
    r = recs[0]
    result = f"held-out accuracy (greedy pass@1): {pct(r['accuracy'])}" if r["accuracy"] is not None else None
    sampled = " · ".join([f"pass@{k} {pct(v)}" for k, v in sorted(r["pass"].items())]
                         + [f"maj@{k} {pct(v)}" for k, v in sorted(r["maj"].items())])
    fresh = next((x for x in recs if x["accuracy"] is not None and not x["stale"] and x["state"] == "done"), None)
    return {"state": r["state"], "result": result, "sampled": sampled and f"{r['samples']} samples per prompt: {sampled}",
            "accuracy": r["accuracy"] if r["state"] == "done" else None, "prompts": r["prompts"], "error": r["error"],
            "adapter": adapters.label_of(r.get("adapter", "")), "at": r.get("at"), "stale": r["stale"],
            "fresh_accuracy": fresh and fresh["accuracy"], "id": r["id"]}
