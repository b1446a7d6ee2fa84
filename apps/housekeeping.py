"""Keeping the runs directory: what a run was launched with (to clone it into a new launch), and archiving
or deleting a run, never while one of its processes runs (no gradio).

The launch form's choice (preset, profile, overrides) is written beside the staged pid file as
`.ui/<name>.launch.json` and moves into the run folder as `launch.json` with it. A run started by
`tinyrl train` has none: its settings are then read back as the differences between its config.yaml
and the preset whose description it carries.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tinyrl.apps import procs, runs_view
from tinyrl.apps.forms import yaml_scalar
from tinyrl.apps.paths import resolve_run
from tinyrl.config import config_changes, list_presets, resolve
from tinyrl.runs import atomic_write_text

LAUNCH = "launch"  # .ui/<name>.launch.json, then <run>/launch.json
ARCHIVE = ".archive"  # inside the runs directory: hidden from the runs list (a leading dot)
UI_OWNED = ("log.run_dir", "log.name")
KINDS = ("train", "eval", "export")


def write_launch(runs_dir: Path, name: str, preset: str, profile: str | None, overrides: list[str]) -> None:
    path = runs_view.staging_file(runs_dir, name, LAUNCH, "json")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"preset": preset, "profile": profile, "overrides": list(overrides)}))


def launch_of(runs_dir: Path, name: str) -> dict | None:
    return runs_view.read_json(runs_view.ui_file(runs_dir, name, LAUNCH, "json"))


def clone(runs_dir: Path, name: str) -> tuple[str, str | None, list[str], str]:
    """(preset, profile, overrides, where they came from) to launch a run like `name` again."""
    launched = launch_of(runs_dir, name)
    if launched and launched.get("preset") in list_presets():
        return launched["preset"], launched.get("profile"), list(launched.get("overrides") or []), \
            "the settings it was launched with"
    cfg = runs_view.run_config(Path(runs_dir) / name)
    if not cfg:
        raise FileNotFoundError(f"run {name!r}: no config.yaml to clone")
    presets = list_presets()
    preset = next((p for p, d in presets.items() if d and d == cfg.get("description")), None)
    if preset is None:
        raise FileNotFoundError(f"run {name!r}: started outside the UI from no shipped preset (its description "
                                f"matches none); launch it with `tinyrl train {Path(runs_dir) / name}/config.yaml`")
    written = resolve(preset, decide_auto=False).written
    changes = config_changes(written, cfg)
    overrides = [f"{k}={yaml_scalar(b)}" for k, (_, b) in changes.items() if k not in UI_OWNED]
    return preset, None, overrides, f"its config.yaml compared with the preset {preset!r}"


def busy(runs_dir: Path, name: str) -> str | None:
    """Which of the run's processes is alive (train / eval / export), None when none is."""
    for kind in KINDS:
        if procs.alive(runs_view.process(runs_dir, name, kind)):
            return kind
    return None


def remove(runs_dir: Path, name: str, archive: bool) -> str:
    """Archive the run folder (moved to `<runs>/.archive/`) or delete it for good; refused while it runs."""
    run = resolve_run(runs_dir, name)
    if not run.is_dir():
        raise FileNotFoundError(f"run {name!r}: no such run folder")
    if (kind := busy(runs_dir, name)) is not None:
        raise PermissionError(f"run {name!r}: its {kind} process is running; stop it first")
    for f in (runs_view.staging_file(runs_dir, name, k, e) for k in ("train", LAUNCH) for e in ("log", "pid", "json")):
        f.unlink(missing_ok=True)
    if not archive:
        shutil.rmtree(run)
        return f"deleted {name} (its folder is gone)"
    dest = Path(runs_dir) / ARCHIVE / name
    if dest.exists():
        dest = dest.with_name(f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    dest.parent.mkdir(exist_ok=True)
    run.rename(dest)
    return f"archived {name}: moved to {ARCHIVE}/{dest.name} in the runs directory (move it back to restore it)"
