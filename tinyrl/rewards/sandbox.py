"""Run model-written Python against a grader's tests in a separate, locked-down process.

`run_tests(code, tests)` starts `_sandbox_child.py` in a fresh interpreter (`python -I`),
sends it the code and the grader's checks, and reads one JSON line per check back from a
pipe. The child's exit code is never read as a result. Linux only.

What it does (each layer the child got is reported in `SandboxResult.isolation`, written
before any untrusted code runs):

- limits: CPU seconds and address space (RLIMIT_CPU / RLIMIT_AS, per process), processes
  and threads (RLIMIT_NPROC), open files, file size (RLIMIT_FSIZE), wall clock (the
  in-sandbox supervisor kills the worker; the host kills the process group as a backstop).
  stdout/stderr go to a pipe that the host reads while the code runs: more than
  `output_bytes` ends the run and scores 0 (a pipe cannot be truncated or seeked, so the
  count is of what the host read, not of what a file holds at the end).
- privileges: as root, the code runs as a fresh random uid (root ignores RLIMIT_NPROC; a
  uid of its own makes the limit count only the sandbox's processes, and leaves no other
  process it could signal), with no groups and no_new_privs (setuid binaries do not
  elevate). Not root: a user namespace, every capability dropped before the code runs
  (where the host allows none: your own uid, every capability dropped, Landlock).
- system calls (`isolation["seccomp"]`, x86_64 and aarch64, with or without namespaces):
  a seccomp filter refuses socket() of every family, socketpair() other than a connected
  AF_UNIX stream pair, SysV shared memory / message queues / semaphores, POSIX message
  queues, io_uring, truncate(2) by path, and namespace and mount calls.
- namespaces, where the kernel allows them: network (no interface up, not even loopback:
  no socket reaches anything), IPC (SysV objects it makes vanish with it), PID (the code
  sees only its own processes; at the end the outer process kills PID 1 and the kernel
  removes every process left in the namespace), and mount: every mount read-only; /tmp a
  fresh small tmpfs (the working directory); /dev a minimal one (null, zero, random,
  urandom, the fd links, a fresh shm); /run, /var/run, home directories, the host's
  working directory and any directory the sandbox user could not enter anyway (e.g. a
  Python under /root) covered by empty tmpfs, with Python's import paths bound back in;
  every filesystem UNIX socket the host has bound (/proc/net/unix) covered by /dev/null.
  Without a PID namespace, the supervisor kills every process of the sandbox uid at the
  end (not root: every process that descends from it, orphans included: it is their
  subreaper) and reaps them.
- integrity: the grader's checks run in a judge process beside the worker, in an
  interpreter the code never touches; the solution's names are proxies there. What crosses
  between them is data (`_sandbox_values`): chosen by exact type in the worker, rebuilt from
  the judge's (or the host's) own classes, so every comparison runs on code the solution never
  touched: a returned Counter equals its dict, a defaultdict its dict, an re.Match is true, a
  type passes as an argument, while a subclass with a lying `__eq__` is no data at all but a
  handle, equal to nothing. A handle (any other object of the solution) can be called, its
  attributes read and set (a tree the grader builds from the solution's class), iterated,
  indexed, measured: values the worker computes, never a verdict. The judge alone holds the
  report pipe and a per-run key; every report line is signed (HMAC-SHA256) and the host drops
  any line it cannot verify. For literal checks and stdin/stdout cases the expected value stays
  in the host. A run that does not end normally (sys.exit / os._exit before the checks, a
  crash, a timeout, too much output) scores 0.
- files without a mount namespace (`isolation["fs"]`; a container with Docker's default
  seccomp profile and no CAP_SYS_ADMIN): Landlock where the kernel has it (it may read only the
  system's and Python's directories and write only its own working directory; from ABI 4 no
  TCP, from ABI 6 no signal out of the sandbox), else as root a chroot into that empty
  directory (it imports only what was preloaded). With neither the run is refused (status
  "error") unless `weak_isolation=True` (see docs/rewards.md, "Decisions").

What it does not protect against: kernel exploits and side channels (it is not a VM or
gVisor); reading world-readable files outside the hidden paths (keep answers and hidden
tests out of world-readable places, or pass them in `hide`); total memory, capped per
process (so up to `nproc` x `memory_mb` in all) rather than per sandbox (no cgroup); CPU
contention while it runs; code that returns answers it knows. Without namespaces: the
kernel's whole system-call surface beyond the seccomp filter, the sum it writes to its
working directory (each file is capped), and when not root on Landlock before ABI 6, a
signal to your own processes. With `weak_isolation=True` on a host with no file layer at all,
/tmp and other world-writable places stay writable and, when not root, the code runs as you,
with your files; sockets and SysV IPC are then held back by the seccomp filter alone (and by
nothing on an architecture without one). `run_tests` logs a warning once when a layer is missing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import random
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tinyrl.errors import ConfigError
from tinyrl.rewards.sandbox_checks import Check, judge, parse_tests  # noqa: F401 (re-exported)

log = logging.getLogger("tinyrl.rewards.sandbox")
CHILD_SCRIPT = str(Path(__file__).with_name("_sandbox_child.py"))
PRELOAD = ["collections", "itertools", "functools", "math", "re", "string", "heapq", "bisect", "typing",
           "copy", "operator", "fractions", "decimal", "statistics", "random", "datetime", "json"]
# imported before the code runs where it may not be able to import them itself (no mount namespace: a uid of its
# own that cannot enter a Python kept under /root, or a chroot): what MBPP / HumanEval solutions import
PRELOAD_MORE = ["array", "cmath", "hashlib", "string", "struct", "_strptime", "calendar", "textwrap", "unicodedata",
                "numbers", "dataclasses", "enum", "pprint", "types", "contextlib", "time", "collections.abc", "keyword",
                "locale", "queue", "operator", "itertools", "io", "abc", "sys", "os", "math", "tempfile", "base64",
                "binascii", "zlib", "difflib", "fnmatch", "glob", "shlex", "secrets", "weakref", "warnings"]
_warned: set[str] = set()


# Every limit's allowed range (inclusive): below it nothing can run (Python itself needs ~40 MiB of
# address space and a few descriptors), above it a run is not bounded in any useful sense.
LIMIT_RANGES: dict[str, tuple] = {
    "cpu_s": (0.1, 3600.0, "seconds"), "wall_s": (0.1, 3600.0, "seconds"), "memory_mb": (64, 65536, "MiB"),
    "nproc": (1, 256, "processes"), "output_bytes": (1, 1 << 30, "bytes"), "file_bytes": (0, 1 << 30, "bytes"),
    "nofile": (16, 4096, "descriptors"), "tmp_mb": (1, 4096, "MiB"), "value_bytes": (1024, 1 << 30, "bytes"),
    "report_bytes": (1024, 1 << 31, "bytes"),
}


def check_limits(values: dict, where: str = "sandbox Limits") -> None:
    """ConfigError naming `<where>.<name>` and its range for each value of `values` that LIMIT_RANGES bounds and
    that is out of range or of the wrong type (a float limit takes an int too; an int limit only an int).

    >>> check_limits({"memory_mb": 0}, "data.task_args")
    Traceback (most recent call last):
    ...
    tinyrl.errors.ConfigError: data.task_args.memory_mb: must be an integer from 64 to 65536 (MiB), got 0
    """
    for name, v in values.items():
        if name not in LIMIT_RANGES:
            continue
        lo, hi, unit = LIMIT_RANGES[name]
        number = isinstance(lo, float)
        ok = type(v) in ((int, float) if number else (int,)) and lo <= v <= hi  # NaN compares False: refused
        if not ok:
            raise ConfigError(f"{where}.{name}: must be {'a number' if number else 'an integer'} from {lo} to "
                              f"{hi} ({unit}), got {v!r:.60}")


@dataclass
class Limits:
    cpu_s: float = 2.0  # CPU seconds per process
    wall_s: float = 5.0  # wall clock for the whole run
    memory_mb: int = 512  # address space per process
    nproc: int = 4  # processes + threads of the sandbox uid (the worker counts as one)
    output_bytes: int = 64 * 1024  # stdout + stderr; more scores 0
    file_bytes: int = 1 << 20  # largest file it may write (RLIMIT_FSIZE)
    nofile: int = 64  # open file descriptors
    tmp_mb: int = 16  # size of its /tmp
    value_bytes: int = 1 << 20  # largest reported value of one check
    report_bytes: int = 8 << 20  # everything it may report

    def __post_init__(self):
        check_limits(vars(self))  # out of range, every run would crash in the sandbox and score 0


@dataclass
class SandboxResult:
    status: str  # "ok" | "timeout" | "crashed" | "output_limit" | "load_error" | "error"
    passed: list[bool]  # one per grader check
    load_error: str | None = None
    output: str = ""  # stdout + stderr (truncated)
    isolation: dict = field(default_factory=dict)  # what the child reported before running any code
    wall_s: float = 0.0
    worker_exit: int | None = None

    @property
    def score(self) -> float:
        """Fraction of the grader's checks passed (0 unless the run ended normally)."""
        if self.status != "ok" or not self.passed:
            return 0.0
        return sum(self.passed) / len(self.passed)


def _pick_uid() -> int:
    """A random uid no one uses, inside this process's uid map (a fresh one per run)."""
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(int(x) for x in ln.split()) for ln in f]
    except OSError:
        ranges = [(0, 0, 1 << 32)]
    lo_hi = [(max(inside, 1 << 20), inside + length - 2) for inside, _, length in ranges]
    lo_hi = [(lo, hi) for lo, hi in lo_hi if hi - lo > 1000]
    if not lo_hi:
        return 65534
    lo, hi = max(lo_hi, key=lambda r: r[1] - r[0])
    return random.SystemRandom().randint(lo, min(hi, (1 << 31) - 2))


_SYSTEM = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev")


def _default_hide() -> list[str]:
    """Home directories, the current directory and the temp directory (never a system one)."""
    paths = {os.path.expanduser("~"), "/root", "/home", os.getcwd(), tempfile.gettempdir()}
    return sorted(p for p in paths if p not in ("/", "/tmp") and not p.startswith(_SYSTEM))


def run_tests(code: str, tests: str | list | dict, entry_point: str | None = None,
              limits: Limits | None = None, hide: list[str] | None = None, namespaces: bool = True,
              weak_isolation: bool = False, landlock: bool = True, chroot: bool = True) -> SandboxResult:
    """Run `code`, then the grader's `tests` in the sandbox; one pass/fail per check.

    `tests`: assert statements, HumanEval's `def check(candidate)` (with `entry_point`), or
    stdin/stdout cases (see `parse_tests`). `hide`: directories to cover (default: home
    directories and the current directory). Without a mount namespace the files are kept
    apart by Landlock where the kernel has it, else (as root) by a chroot into an empty
    directory; with none of the three the run is refused (status "error") unless
    `weak_isolation=True`: the code could then read world-readable files and write
    world-writable folders of the host. `namespaces=False`, `landlock=False`, `chroot=False`
    skip that layer, as on a host that does not allow it (the tests run every fallback so).
    """
    limits = limits or Limits()
    steps, checks = parse_tests(tests, entry_point)
    root = os.geteuid() == 0
    uid = _pick_uid() if root else os.getuid()
    judge_uid = _pick_uid() if root else uid  # as root the judge gets a uid of its own too
    key = secrets.token_bytes(32)  # signs the report: the worker never holds it
    workdir = tempfile.mkdtemp(prefix="tinyrl-sbx-")  # its working directory only where there is no mount namespace
    if root:
        os.chown(workdir, uid, uid)
    os.chmod(workdir, 0o700)
    job = {"code": code, "steps": steps, "io": any(c.kind == "io" for c in checks), "limits": vars(limits),
           "uid": uid, "gid": uid, "judge_uid": judge_uid, "workdir": workdir, "entry_point": entry_point,
           "hide": _default_hide() if hide is None else hide, "preload": PRELOAD, "preload_more": PRELOAD_MORE,
           "namespaces": namespaces, "landlock": landlock, "chroot": chroot, "require_fs": not weak_isolation}
    r, w = os.pipe()
    out_r, out_w = os.pipe()  # stdout + stderr: a pipe, so the code cannot truncate or seek back what it wrote
    key_r, key_w = os.pipe()  # the key, on a pipe of its own: read by the child once its worker exists
    os.write(key_w, key)
    os.close(key_w)
    job["report_fd"], job["key_fd"] = w, key_r
    start = time.monotonic()
    try:
        proc = subprocess.Popen([sys.executable, "-I", CHILD_SCRIPT], stdin=subprocess.PIPE, stdout=out_w,
                                stderr=subprocess.STDOUT, pass_fds=(w, key_r), close_fds=True, start_new_session=True,
                                cwd=workdir, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"})
    except OSError as e:
        for fd in (r, w, out_r, out_w, key_r):
            os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)
        return SandboxResult("error", [False] * len(checks), load_error=f"could not start the sandbox: {e}")
    os.close(w)
    os.close(out_w)
    os.close(key_r)
    reader = _Reader(r, out_r, limits, key)
    try:
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except OSError:
            pass  # it died at once; the report says so
        reader.run(start + limits.wall_s + 10.0)  # the supervisor keeps the wall time; start-up can be slow
    finally:
        os.close(r)
        _stop(proc)
        reader.drain(time.monotonic() + 1.0)  # what was already written; every writer is gone after _stop
        os.close(out_r)
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.monotonic() - start
    return _result(reader.msgs, reader.done, checks, bytes(reader.output), wall, limits, reader.over)


def _stop(proc: subprocess.Popen) -> None:
    """End the run: SIGTERM asks the outer process to kill PID 1 of the namespace and wait
    until the kernel has removed every process in it; SIGKILL to the group is the backstop."""
    try:
        proc.terminate()
        proc.wait(timeout=3.0)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the outer process leads the group
    except OSError:
        pass
    proc.wait()


class _Reader:
    """Reads the report pipe and the output pipe together, counting output as it arrives.

    Output past `limits.output_bytes` ends the run at once (status "output_limit"): the limit
    is enforced on what the host has read, which nothing in the sandbox can take back."""

    def __init__(self, report_fd: int, out_fd: int, limits: Limits, key: bytes):
        self.report_fd, self.out_fd, self.limits, self.key = report_fd, out_fd, limits, key
        self.msgs: list[dict] = []
        self.output = bytearray()
        self.done = self.over = False
        self._buf, self._report_bytes = b"", 0

    def run(self, deadline: float) -> None:
        fds = [self.report_fd, self.out_fd]
        while self.report_fd in fds and not self.over:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for fd in select.select(fds, [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    fds.remove(fd)
                elif fd == self.out_fd:
                    self._take_output(chunk)
                elif self._take_report(chunk):
                    return

    def drain(self, deadline: float) -> None:
        while not self.over and time.monotonic() < deadline:
            if not select.select([self.out_fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return
            chunk = os.read(self.out_fd, 65536)
            if not chunk:
                return
            self._take_output(chunk)

    def _take_output(self, chunk: bytes) -> None:
        room = self.limits.output_bytes + 1 - len(self.output)
        self.output += chunk[:max(room, 0)]
        self.over = len(self.output) > self.limits.output_bytes

    def _take_report(self, chunk: bytes) -> bool:
        """True when the report is complete ("done" or the worker's exit), or over its size limit."""
        self._report_bytes += len(chunk)
        if self._report_bytes > self.limits.report_bytes:
            return True
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        for ln in lines:
            msg = self._verified(ln)
            if isinstance(msg, dict):
                self.msgs.append(msg)
                if msg.get("done") is True or "worker_exit" in msg:
                    self.done = msg.get("done") is True
                    return True
        return False


    def _verified(self, line: bytes):
        """The message of a report line signed with this run's key; None for anything else (a forgery)."""
        try:
            signed = json.loads(line)
            payload = signed["p"]
            mac = hmac.new(self.key, payload.encode(), hashlib.sha256).hexdigest()
            return json.loads(payload) if hmac.compare_digest(mac, str(signed["m"])) else None
        except Exception:  # noqa: BLE001 - garbage on the pipe: ignored
            return None


def _result(msgs, done, checks, output: bytes, wall, limits, over: bool = False) -> SandboxResult:
    ready = msgs[0] if msgs and "ready" in msgs[0] else {}
    iso = ready.get("ready", {}) if isinstance(ready.get("ready"), dict) else {}
    refused = str(ready.get("fatal", "")).startswith("refused")
    if refused and "refused" not in _warned:
        _warned.add("refused")
        log.warning("code sandbox: %s; until then every code sample is excluded (scored None)", ready["fatal"])
    if not refused:
        _warn_isolation(iso)
    passed, seen = [False] * len(checks), set()
    load_error = ready.get("fatal")
    exit_code = None
    for msg in msgs[1:]:
        i = msg.get("i")
        if isinstance(i, int) and 0 <= i < len(checks) and i not in seen:  # first report of a check counts
            seen.add(i)
            passed[i] = judge(checks[i], msg)
        elif "load_error" in msg and load_error is None:
            load_error = str(msg["load_error"])
        elif "worker_exit" in msg:
            exit_code = msg["worker_exit"]
    if over or len(output) > limits.output_bytes:
        status = "output_limit"
    elif not ready or ready.get("fatal"):  # no sandbox, or one that refused to run: not the code's doing
        status = "error"
    elif load_error:
        status = "load_error"
    elif done:
        status = "ok"
    elif wall >= limits.wall_s:
        status = "timeout"
    else:
        status = "crashed"
    text = output[: limits.output_bytes].decode("utf-8", "replace")
    return SandboxResult(status, passed, load_error, text, iso, wall, exit_code)


def _warn_isolation(iso: dict) -> None:
    """One warning per combination of missing layers, saying what that leaves open and what holds instead."""
    missing = [k for k in ("net", "mount", "pid", "ipc", "seccomp") if iso and not iso.get(k)]
    key = ",".join(missing) + f"/{iso.get('fs')}"
    if not missing or key in _warned:
        return
    _warned.add(key)
    what = []
    if not iso.get("seccomp"):
        what.append("sockets are NOT blocked" if "net" not in missing else "the network is NOT isolated")
        if "ipc" in missing:
            what.append("SysV IPC is shared with the host")
    if "mount" in missing:
        what.append({"landlock": f"files: Landlock (ABI {iso.get('landlock')}) lets it read only the system's and "
                                 "Python's directories and write only its own",
                     "chroot": "files: a chroot into its own empty directory (it imports only what was preloaded)"
                     }.get(iso.get("fs"), "files are protected only by permissions" if iso.get("root")
                           else "the code runs as your user and can read and write your files"))
    log.warning("code sandbox: missing %s; %s", "/".join(missing),
                "; ".join(what) or "the remaining layers still hold (see tinyrl.rewards.sandbox)")
