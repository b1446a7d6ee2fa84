"""Start, stop, resume, evaluate and export runs as subprocesses that never depend on the UI.

Each `tinyrl train` / `tinyrl eval` is `sys.executable -m tinyrl.cli ...` in its own session
(closing or killing the UI never signals it), writing stdout+stderr straight into a log file
(no pipe for the UI to drain), with a pid file beside it. The trainer decides and creates the
run folder: the UI passes `log.run_dir=<runs dir>` and a fresh `log.name`, and keeps the log and
pid file in `<runs dir>/.ui/` until the folder exists with training under way, then moves both
into it (the process keeps writing to the same open file). Everything is found again from the
folders, so a new UI process re-attaches to running runs.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from tinyrl.apps import adapters, evals, exports, housekeeping, procs, runs_view
from tinyrl.apps.forms import Plan, runs_dir_override, split_overrides
from tinyrl.apps.paths import check_name, inside, resolve_run
from tinyrl.config import config_changes, parse_override, resolve
from tinyrl.hub_push import check_repo_id


class LaunchError(RuntimeError):
    """An action the UI refuses (already running, nothing to resume, no adapter ...), in words."""


def new_run_name(runs_dir: Path, preset: str) -> str:
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in preset).lstrip(".-_") or "run"
    while True:
        name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        if not _taken(runs_dir, name):
            return name


def _taken(runs_dir: Path, name: str) -> bool:
    return (Path(runs_dir) / name).exists() or runs_view.staging_file(runs_dir, name, "train", "pid").exists()


class Launcher:
    def __init__(self, runs_dir: Path, cwd: Path | None = None):
        self.runs_dir = Path(runs_dir).resolve()
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.cwd = Path(cwd or os.getcwd())
        self._children: list[subprocess.Popen] = []

    # ------------------------------------------------------------------ processes

    def _spawn(self, cmd: list[str], log: Path, pid_file: Path, kind: str, banner: str) -> dict:
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(log, "ab") as out:
            out.write(f"=== tinyrl ui: {banner} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n$ {' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.cwd, env=env, start_new_session=True, close_fds=True)
        self._children.append(proc)
        return procs.write_pidfile(pid_file, proc.pid, cmd, kind)

    def reap(self) -> None:
        """Collect exited children (so they are not left as zombies while this UI runs)."""
        self._children = [p for p in self._children if p.poll() is None]

    def adopt(self) -> None:
        """Move staged log + pid files into their run folders once training is under way there."""
        staged = self.runs_dir / runs_view.UI_DIR
        if not staged.is_dir():
            return
        for pid_file in staged.glob("*.train.pid"):
            name = pid_file.name[: -len(".train.pid")]
            run = self.runs_dir / name
            if not run.is_dir() or not ((run / "metrics.jsonl").exists()
                                        or not procs.alive(procs.read_pidfile(pid_file))):
                continue  # the trainer may still remove a folder whose start failed
            for kind_ext in ("train.log", "train.pid", f"{housekeeping.LAUNCH}.json"):
                src = staged / f"{name}.{kind_ext}"
                if src.exists() and not (run / kind_ext).exists():
                    os.replace(src, run / kind_ext)

    def refresh(self) -> None:
        self.reap()
        self.adopt()

    # ------------------------------------------------------------------ actions

    def start(self, plan: Plan, name: str | None = None) -> str:
        """Launch a validated plan; returns the run name (its folder once the trainer makes it)."""
        name = check_name(name) if name else new_run_name(self.runs_dir, plan.preset)
        if _taken(self.runs_dir, name):
            raise LaunchError(f"run {name!r} exists already in {self.runs_dir}; pick another name")
        resolve_run(self.runs_dir, name)
        cmd = plan.command(runs_dir_override(self.runs_dir, name))
        housekeeping.write_launch(self.runs_dir, name, plan.preset, plan.profile, plan.overrides)
        self._spawn(cmd, runs_view.staging_file(self.runs_dir, name, "train", "log"),
                    runs_view.staging_file(self.runs_dir, name, "train", "pid"), "train", "train")
        return name

    def run_path(self, name: str) -> Path:
        path = resolve_run(self.runs_dir, name)
        if not path.is_dir() and not runs_view.staging_file(self.runs_dir, name, "train", "pid").exists():
            raise LaunchError(f"run {name!r}: no such run in {self.runs_dir}")
        return path

    def stop(self, name: str) -> str:
        """SIGTERM the run: the trainer finishes its step, saves a checkpoint and exits."""
        self.run_path(name)
        info = runs_view.process(self.runs_dir, name)
        if not procs.alive(info):
            raise LaunchError(f"run {name!r} is not running")
        if not procs.is_local(info):
            raise LaunchError(f"run {name!r} runs on host {info.get('host')}; stop it there")
        procs.terminate(info)
        return f"sent SIGTERM to {name} (pid {info['pid']}): it checkpoints after the current step and exits"

    def resume(self, name: str, overrides: str = "") -> str:
        """`tinyrl train --resume <run> [overrides]` as a new process, appending to the run's train.log."""
        run = self.run_path(name)
        if procs.alive(runs_view.process(self.runs_dir, name)):
            raise LaunchError(f"run {name!r} is running; stop it before resuming")
        if not runs_view.checkpoints(run):
            raise LaunchError(f"run {name!r} has no checkpoint to resume from")
        tokens = split_overrides(overrides)  # refuses log.run_dir / log.name: a resumed run stays put
        kv = {".".join(k): v for k, v in map(parse_override, tokens)}
        resolved = resolve(overrides=kv, resume=run, decide_auto=False)  # the resolution `tinyrl train --resume` makes
        changed = config_changes(runs_view.run_config(run), resolved.written)
        cmd = [sys.executable, "-m", "tinyrl.cli", "train", "--resume", str(run), *tokens]
        self._spawn(cmd, run / "train.log", run / "train.pid", "train", "resume")
        what = "; ".join(f"{k} {a} → {b}" for k, (a, b) in changed.items()) if changed else "nothing changed"
        return f"resuming {name} from {runs_view.checkpoints(run)[-1].name}: {what}"

    def adapter_dir(self, name: str) -> Path:
        """The run's final adapter, else the adapter of its latest checkpoint."""
        found = runs_view.adapter_dir(self.run_path(name))
        if found is None:
            raise LaunchError(f"run {name!r} has no adapter yet (neither adapter/ nor a checkpoint)")
        return found

    def evaluate(self, name: str, choice: str | None = None, samples: int = 0, ks: list[int] = (),
                 prompts: int | None = None) -> str:
        """`tinyrl eval <run>/config.yaml --adapter A [--samples N --k ...] [data.num_eval=M]` of the chosen
        adapter (adapters.py: latest, best, a checkpoint), recorded in <run>/evals/ (evals.py)."""
        run = self.run_path(name)
        if procs.alive(runs_view.process(self.runs_dir, name, "eval")):
            raise LaunchError(f"an evaluation of {name!r} is running already")
        key, adapter = self._adapter(run, choice)
        samples, ks = int(samples or 0), sorted({int(k) for k in ks or ()})
        if samples and ks and ks[-1] > samples:
            raise LaunchError(f"k={ks[-1]} needs at least {ks[-1]} samples per prompt (k <= samples)")
        rec = evals.new_record(run, key, adapter, samples, ks, prompts)
        self._spawn(evals.command(run, adapter, samples, ks, prompts), evals.log_path(run, rec), run / "eval.pid",
                    "eval", f"eval {adapter.relative_to(run)}")
        return f"evaluating {name} ({adapters.label_of(key)}); the result appears below when it is done"

    def _adapter(self, run: Path, choice: str | None) -> tuple[str, Path]:
        try:
            return adapters.resolve(run, choice)
        except FileNotFoundError as e:
            raise LaunchError(str(e)) from None

    def export(self, name: str, kind: str, out_name: str = "", dtype: str = "bfloat16", push: str = "",
               private: bool = False, gguf_type: str = "f16") -> str:
        """`tinyrl export <run> ...` as a process (exports.py); the adapter alone is copied here (no model)."""
        run = self.run_path(name)
        if kind not in exports.KINDS or (kind == "gguf" and exports.gguf_missing()):
            raise LaunchError(exports.gguf_missing() if kind == "gguf" else f"export: no kind {kind!r}")
        if procs.alive(runs_view.process(self.runs_dir, name, "export")):
            raise LaunchError(f"an export of {name!r} is running already")
        if not (run / "adapter" / "adapter_config.json").is_file():
            raise LaunchError(f"run {name!r} has no final adapter yet (interrupted, or still training): "
                              f"Resume it to its end, then export")
        if push:
            check_repo_id(push.strip())
            ok, words = exports.login_state()
            if not ok:
                raise LaunchError(words)
        out_name = out_name.strip() or exports.default_name(kind, dtype, gguf_type)
        out_name += ".gguf" if kind == "gguf" and not out_name.endswith(".gguf") else ""
        out = exports.out_path(run, out_name)
        if out.exists():
            raise LaunchError(f"export {out.name!r} exists already in {name}/{exports.OUT_DIR}; pick another name")
        rel = str(out.relative_to(run))
        exports.write_info(run, kind=kind, out=rel, push=push.strip() or None, dtype=dtype, gguf_type=gguf_type)
        if kind == "adapter":
            exports.copy_adapter(run, out)
            if not push:
                return f"exported the adapter of {name} to {name}/{rel}"
        out.parent.mkdir(exist_ok=True)
        cmd = exports.command(run, kind, None if kind == "adapter" else out, dtype, push.strip() or None, private,
                              gguf_type)
        self._spawn(cmd, run / exports.LOG, run / "export.pid", "export", f"export {kind}")
        return f"exporting {name} ({exports.KINDS[kind]}) to {name}/{rel}" + (f", then to the hub as {push}" if push else "")

    def adapter_zip(self, name: str) -> Path:
        """A zip of the adapter folder (regular files only; symlinks are skipped), in a fresh temp dir."""
        adapter = self.adapter_dir(name)
        run = self.run_path(name)
        out = Path(tempfile.mkdtemp(prefix="tinyrl-adapter-")) / f"{name}-adapter.zip"
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for root, _dirs, files in os.walk(adapter, followlinks=False):
                for f in sorted(files):
                    p = Path(root) / f
                    if p.is_file() and not p.is_symlink() and inside(p, run):
                        z.write(p, p.relative_to(adapter))
        return out
