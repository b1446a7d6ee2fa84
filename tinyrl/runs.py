"""The run folder: config snapshot, metrics.jsonl, samples.jsonl, checkpoints, final adapter.

    runs/<name>/
      config.yaml          the resolved config
      metrics.jsonl        one line per step
      samples.jsonl        a few prompts / completions / rewards per step
      alarms.jsonl         monitor alarms
      checkpoints/step-000010/   adapter + trainer_state.pt (atomic: tmp dir, fsync, rename)
      adapter/             the final LoRA adapter (peft format)

JSONL lines are written whole and flushed; a torn last line (a crash mid-write) is dropped
when the folder is opened again, so readers always see valid JSONL.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import yaml

CKPT_PREFIX = "step-"


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a JSONL file (a torn last line is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "a")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, default=_jsonable) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def truncate_jsonl(path: Path, keep_through_step: int) -> None:
    """Keep only whole lines with step <= keep_through_step (resume: no duplicates)."""
    if not path.exists():
        return
    rows = [r for r in read_jsonl(path) if r.get("step", 0) <= keep_through_step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"

    @staticmethod
    def create(root: str, name: str, config: dict) -> "RunDir":
        path = Path(root) / name
        if path.exists() and any(path.iterdir()):
            path = Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        path.mkdir(parents=True, exist_ok=True)
        run = RunDir(path)
        atomic_write_text(path / "config.yaml", yaml.safe_dump(config, sort_keys=False))
        return run

    def config(self) -> dict:
        cfg_path = self.path / "config.yaml"
        if not cfg_path.exists():
            raise FileNotFoundError(f"--resume {self.path}: no config.yaml there; is it a tinyrl run folder?")
        return yaml.safe_load(cfg_path.read_text())

    def writer(self, name: str) -> JsonlWriter:
        path = self.path / name
        if path.exists():  # drop a torn last line left by a crash
            text = path.read_text()
            if text and not text.endswith("\n"):
                atomic_write_text(path, text[: text.rfind("\n") + 1])
        return JsonlWriter(path)

    def metrics(self) -> list[dict]:
        return read_jsonl(self.path / "metrics.jsonl")

    # ------------------------------------------------------------------ checkpoints

    def checkpoints(self) -> list[Path]:
        if not self.ckpt_dir.exists():
            return []
        return sorted(p for p in self.ckpt_dir.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX))

    def latest_checkpoint(self) -> Path | None:
        ckpts = self.checkpoints()
        return ckpts[-1] if ckpts else None

    def save_checkpoint(self, step: int, write_fn, keep_last: int) -> Path:
        """`write_fn(tmp_dir)` writes the files; then fsync + rename makes it visible at once."""
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        final = self.ckpt_dir / f"{CKPT_PREFIX}{step:06d}"
        tmp = self.ckpt_dir / f".tmp-{CKPT_PREFIX}{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write_fn(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(self.ckpt_dir)
        for old in self.checkpoints()[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final
