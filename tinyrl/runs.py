"""The run folder: config snapshot, metrics.jsonl, samples.jsonl, checkpoints, final adapter.

    runs/<name>/
      config.yaml          the resolved config (rewritten, with the overrides, on each resume)
      resumes.jsonl        one line per resume: the checkpoint, the overrides, what changed
      metrics.jsonl        one line per step
      samples.jsonl        a few prompts / completions / rewards per step
      alarms.jsonl         monitor alarms
      checkpoints/step-000010/   adapter + trainer_state.pt
      adapter/             the final LoRA adapter (peft format)
      .lock                who writes here: pid and host (held with flock while a run is live)

One writer per folder. `RunDir.create` makes a new folder with an exclusive mkdir (two
runs given the same name get different folders); `RunDir.lock` takes the folder for one
process: a live run elsewhere makes it fail with `RunLockedError`, naming the pid and
host; a lock left by a process that is gone is taken over.

Nothing half-written is ever visible: files are written to a unique temp name, fsynced and
renamed; a checkpoint is written whole to a temp directory and renamed in. Replacing a
checkpoint of the same step renames the old one aside first, renames the new one in, then
deletes the old: a kill at any point leaves a complete checkpoint, and `recover()` (run when
a folder is opened to resume) puts an aside one back if the new one never arrived. Pruned
checkpoints (`train.keep_last`) are renamed out of sight before they are deleted. JSONL
lines are written whole and flushed; a torn last line (a crash mid-write) is dropped when
the folder is opened again, so readers always see valid JSONL. Non-finite numbers are
written as null (strict JSON has no NaN or Infinity).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import shutil
import signal
import socket
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tinyrl.errors import ConfigError

log = logging.getLogger("tinyrl.runs")
CKPT_PREFIX = "step-"
LOCK_FILE = ".lock"
_ASIDE = ".old-"  # checkpoints/.old-step-000010-<unique>: the checkpoint being replaced
_DOOMED = ".del-"  # checkpoints/.del-step-000002-<unique>: a checkpoint being pruned (keep_last)
KILL_ENV = "TINYRL_TEST_KILL_AT"  # tests: SIGKILL this process at the named point of a checkpoint save


@dataclass
class Run:
    """What a finished (or stopped) run hands back: its folder and the figures its summary.json holds."""

    path: Path
    metrics: list[dict]
    eval_before: float | None = None
    eval_after: float | None = None
    adapter: Path | None = None
    alarms: list[dict] = field(default_factory=list)
    interrupted: bool = False
    resumable: bool = True  # an interrupted run whose folder holds a checkpoint to continue from


class RunFolderError(OSError):
    """A run folder that cannot be created, written or read (the message names the path)."""


class RunLockedError(RunFolderError):
    """Another live process writes this run folder."""


def _kill_point(name: str) -> None:
    """Test hook: `TINYRL_TEST_KILL_AT=name` kills this process with SIGKILL here (a deterministic crash)."""
    if os.environ.get(KILL_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


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


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1], 8) for ln in f if ln.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


_UMASK = _umask()  # temp files and dirs get the modes plain open() / mkdir() would give (mkstemp: 0600)


def _folder_error(e: OSError, what: str, path) -> RunFolderError:
    return RunFolderError(e.errno or errno.EIO, f"cannot {what} {path}: {e.strerror or e}")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to a unique temp file beside `path`, fsync, rename over `path`."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _folder_error(e, "write", path) from e
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _folder_error(e, "write", path) from e


def finite_json(x):
    """`x` with every non-finite float (NaN, +-inf) replaced by None, recursively.

    >>> finite_json({"a": float("nan"), "b": [1.0, float("inf")], "c": "x"})
    {'a': None, 'b': [1.0, None], 'c': 'x'}
    """
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:  # a 0-d tensor or numpy scalar
        return finite_json(x.item())
    return x


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        try:
            self._f = open(path, "a")
        except OSError as e:
            raise _folder_error(e, "open", path) from e

    def write(self, record: dict) -> None:
        line = json.dumps(finite_json(record), default=_jsonable, allow_nan=False) + "\n"
        try:
            self._f.write(line)
            self._f.flush()
        except OSError as e:
            raise _folder_error(e, "write", self.path) from e

    def close(self) -> None:
        try:
            self._f.close()
        except OSError as e:  # the flush of a full disk: already reported by write
            log.warning("closing %s: %s", self.path, e)


def _jsonable(x):
    if hasattr(x, "item"):
        return finite_json(x.item())
    return str(x)


def truncate_jsonl(path: Path, keep_through_step: int) -> None:
    """Keep only whole lines with step <= keep_through_step (resume: no duplicates)."""
    if not path.exists():
        return
    rows = [r for r in read_jsonl(path) if r.get("step", 0) <= keep_through_step]
    atomic_write_text(path, "".join(json.dumps(finite_json(r)) + "\n" for r in rows))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


_LOCKED: weakref.WeakSet = weakref.WeakSet()  # RunDirs this process holds locked


def _drop_locks_in_child() -> None:
    """In a forked child (the rewards' process): close its copies of the lock descriptors, untouched
    (no LOCK_UN, no truncation: the parent still holds the lock). A child that kept them would keep the
    folder locked after its parent let it go (flock belongs to the open file, which a fork shares)."""
    for run in list(_LOCKED):
        fd, run._lock_fd = run._lock_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _forget_locks_in_forks(run: "RunDir") -> None:
    if hasattr(os, "register_at_fork") and not getattr(_drop_locks_in_child, "registered", False):
        os.register_at_fork(after_in_child=_drop_locks_in_child)
        _drop_locks_in_child.registered = True
    _LOCKED.add(run)


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"
        self._lock_fd: int | None = None

    @staticmethod
    def create(root: str, name: str, config: dict) -> "RunDir":
        """A new run folder `root/name` (or `name-<time>[-k]` when taken), locked, with config.yaml."""
        root_path = Path(root)
        parts = Path(name).parts if name else ()
        if not parts or Path(name).is_absolute() or ".." in parts:  # '.' has no part: it is the run_dir itself
            raise ConfigError(f"log.name: must be a folder name inside log.run_dir, got {name!r}")
        try:
            root_path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _folder_error(e, "create the runs folder (log.run_dir)", root_path) from e
        base = root_path / name
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _folder_error(e, "create", base.parent) from e
        if base.exists() and not base.is_dir():
            raise RunFolderError(errno.EEXIST, f"log.name: {base} exists and is not a folder")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for k in range(1000):
            path = base if k == 0 else base.with_name(f"{base.name}-{stamp}" + (f"-{k}" if k > 1 else ""))
            try:
                path.mkdir()  # exclusive: exactly one process creates a given folder
                break
            except FileExistsError:
                continue
            except OSError as e:
                raise _folder_error(e, "create", path) from e
        else:
            raise RunFolderError(errno.EEXIST, f"cannot find a free run folder name for {base}")
        run = RunDir(path)
        try:
            run.lock()
            atomic_write_text(path / "config.yaml", yaml.safe_dump(config, sort_keys=False))
        except BaseException:  # a full disk, or a Ctrl-C / SIGTERM right here: no half-made folder stays
            run.unlock()
            shutil.rmtree(path, ignore_errors=True)
            raise
        return run

    # ------------------------------------------------------------------ one writer

    def lock(self) -> None:
        """Take this folder for this process (flock on .lock, which records pid and host).

        Raises RunLockedError when a live process holds it, or when the lock names another
        host (its process cannot be checked from here). A lock whose process is gone is
        taken over, with a log line."""
        if self._lock_fd is not None:
            return
        path = self.path / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _folder_error(e, "lock", path) from e
        holder = _read_lock(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunLockedError(errno.EBUSY, f"run folder {self.path} is in use by {_describe(holder)}; "
                                 f"wait for it to finish (or stop it), or start a new run") from None
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        if holder and holder.get("pid") != me["pid"]:
            if holder.get("host") != me["host"]:
                os.close(fd)
                raise RunLockedError(errno.EBUSY, f"run folder {self.path} is locked by {_describe(holder)}, "
                                     f"which cannot be checked from {me['host']}; if that run is over, "
                                     f"delete {path}")
            if _pid_alive(int(holder.get("pid", -1))):
                os.close(fd)  # flock did not see it (a file system without flock): trust the record
                raise RunLockedError(errno.EBUSY, f"run folder {self.path} is in use by {_describe(holder)}")
            log.info("run folder %s: taking over the lock of %s (that process is gone)", self.path, _describe(holder))
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({**me, "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
            os.fsync(fd)
        except OSError as e:
            os.close(fd)
            raise _folder_error(e, "lock", path) from e
        self._lock_fd = fd
        _forget_locks_in_forks(self)

    def unlock(self) -> None:
        """Release the folder (the lock file stays, emptied; a process that dies releases it too)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing drops the flock

    def __del__(self):
        self.unlock()

    def discard(self) -> None:
        """Remove a folder this process just created (nothing in it but config.yaml and the lock)."""
        self.unlock()
        extra = [p.name for p in self.path.iterdir() if p.name not in ("config.yaml", LOCK_FILE)] \
            if self.path.is_dir() else []
        if extra:
            log.warning("not removing %s: it holds %s", self.path, extra)
            return
        shutil.rmtree(self.path, ignore_errors=True)

    # ------------------------------------------------------------------ files

    def config(self) -> dict:
        cfg_path = self.path / "config.yaml"
        if not self.path.is_dir():
            raise RunFolderError(errno.ENOENT, f"--resume {self.path}: no such run folder")
        if not cfg_path.exists():
            raise RunFolderError(errno.ENOENT, f"--resume {self.path}: no config.yaml there; is it a tinyrl run folder?")
        try:
            data = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            mark = getattr(e, "problem_mark", None)
            where = f", line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{cfg_path}{where}: the run folder's config is corrupt ({_first_line(e)}); "
                              f"restore it, or start a new run") from None
        except OSError as e:
            raise _folder_error(e, "read", cfg_path) from e
        if not isinstance(data, dict):
            raise ConfigError(f"{cfg_path}: the run folder's config is corrupt (not a mapping of sections)")
        return data

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

    def recover(self) -> list[str]:
        """Finish what a kill interrupted in checkpoints/: put back a checkpoint renamed aside whose
        replacement never arrived, delete asides whose replacement did, and half-written temp
        directories. Returns what it did (for the log)."""
        done = []
        if not self.ckpt_dir.is_dir():
            return done
        for p in sorted(self.ckpt_dir.iterdir()):
            if p.name.startswith(_ASIDE + CKPT_PREFIX):
                final = self.ckpt_dir / p.name[len(_ASIDE):].rsplit("-", 1)[0]
                if final.exists():
                    shutil.rmtree(p, ignore_errors=True)
                    done.append(f"removed {p.name} (its replacement {final.name} is complete)")
                else:
                    os.rename(p, final)
                    done.append(f"restored {final.name} (a replacement was interrupted)")
            elif p.name.startswith((".tmp-", _DOOMED)):
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"removed the half-written or half-deleted {p.name}")
        if done:
            _fsync_dir(self.ckpt_dir)
        return done

    def save_checkpoint(self, step: int, write_fn, keep_last: int) -> Path:
        """`write_fn(tmp_dir)` writes the files; fsync + rename make them visible at once.

        An existing checkpoint of the same step is renamed aside before the new one is renamed
        in, and deleted after: at every moment one complete checkpoint of the step exists
        (or is restored by `recover`)."""
        final = self.ckpt_dir / f"{CKPT_PREFIX}{step:06d}"
        self._finish_pruning()  # what an earlier save, stopped by a signal while pruning, left
        try:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.ckpt_dir, prefix=f".tmp-{final.name}-"))
            tmp.chmod(0o777 & ~_UMASK)
        except OSError as e:
            raise _folder_error(e, "write the checkpoint", final) from e
        try:
            write_fn(tmp)
            for f in tmp.rglob("*"):
                if f.is_file():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            _fsync_dir(tmp)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, Exception):  # a full disk: OSError, torch's RuntimeError, safetensors' own error
                raise RunFolderError(getattr(e, "errno", None) or errno.EIO,
                                     f"cannot write the checkpoint {final}: {_first_line(e)}; "
                                     f"the previous checkpoint is intact") from e
            raise
        _kill_point("checkpoint-written")
        aside = None
        if final.exists():
            aside = self.ckpt_dir / f"{_ASIDE}{final.name}-{os.getpid()}{time.monotonic_ns()}"
            os.rename(final, aside)
            _kill_point("checkpoint-aside")
        os.rename(tmp, final)
        _fsync_dir(self.ckpt_dir)
        _kill_point("checkpoint-renamed")
        try:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
            for old in self.checkpoints()[:-keep_last]:  # renamed out of sight first: never seen half-deleted
                doomed = self.ckpt_dir / f"{_DOOMED}{old.name}-{os.getpid()}{time.monotonic_ns()}"
                os.rename(old, doomed)
                _kill_point("checkpoint-pruning")
                shutil.rmtree(doomed, ignore_errors=True)
        finally:  # a Ctrl-C / SIGTERM landing in a deletion (the new checkpoint is complete): finish it
            self._finish_pruning()
        return final

    def _finish_pruning(self) -> None:
        """Delete what a save renamed out of sight to delete, whatever stopped it: a pruned checkpoint
        (`.del-*`), a replaced one whose replacement is complete (`.old-*`). Never a checkpoint."""
        if not self.ckpt_dir.is_dir():
            return
        for p in self.ckpt_dir.iterdir():
            replaced = p.name.startswith(_ASIDE + CKPT_PREFIX) and \
                (self.ckpt_dir / p.name[len(_ASIDE):].rsplit("-", 1)[0]).is_dir()
            if p.name.startswith(_DOOMED) or replaced:
                shutil.rmtree(p, ignore_errors=True)


def _read_lock(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return data if isinstance(data, dict) else {}
    except (ValueError, OSError):
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid')} on host {holder.get('host')} (since {holder.get('started', '?')})"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
