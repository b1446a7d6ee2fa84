"""Run model-written Python against a grader's tests in a separate, locked-down process.

`run_tests(code, tests)` starts `_sandbox_child.py` in a fresh interpreter (`python -I`),
sends it the code and the grader's checks, and reads one JSON line per check back from a
pipe. The child's exit code is never read as a result. Linux only.

What it does (each layer the child got is reported in `SandboxResult.isolation`, written
before any untrusted code runs):

- limits: CPU seconds and address space (RLIMIT_CPU / RLIMIT_AS, per process), processes
  and threads (RLIMIT_NPROC), open files, file size (RLIMIT_FSIZE; stdout/stderr go to an
  anonymous host file read back up to `output_bytes`, and more scores 0), wall clock (the
  in-sandbox supervisor kills the worker; the host kills the process group as a backstop).
- privileges: as root, the code runs as a fresh random uid (root ignores RLIMIT_NPROC; a
  uid of its own makes the limit count only the sandbox's processes, and leaves no other
  process it could signal), with no groups and no_new_privs (setuid binaries do not
  elevate). Not root: a user namespace, every capability dropped before the code runs.
- namespaces, where the kernel allows them: network (no interface up, not even loopback:
  no socket reaches anything), PID (the code sees only its own processes; at the end the
  outer process kills PID 1 and the kernel removes every process left in the namespace),
  and mount: every mount read-only; /tmp and /dev/shm fresh small tmpfs (/tmp is the
  working directory); home directories, the host's working directory and any directory
  the sandbox user could not enter anyway (e.g. a Python under /root) covered by empty
  tmpfs, with Python's import paths bound back in. Without a PID namespace, the
  supervisor kills every process of the sandbox uid at the end and reaps them.
- integrity: for `assert f(x) == <literal>` and stdin/stdout cases the expected value
  stays in the host: the child only computes `f(x)` (or the program's output) and sends
  it as plain data, by exact builtin type (an object with a lying `__eq__` fails); the host
  compares. A run that does not end normally (sys.exit / os._exit before the checks, a
  crash, a timeout, too much output) scores 0. The model's own asserts are just code.

What it does not protect against: kernel exploits and side channels (it is not a VM or
gVisor); reading world-readable files outside the hidden paths (keep answers and hidden
tests out of world-readable places, or pass them in `hide`); total memory, capped per
process (so up to `nproc` x `memory_mb` in all) rather than per sandbox (no cgroup); CPU
contention while it runs. Other asserts (`assert is_prime(7)`, loops of asserts) are
judged from what the child reports, and a program written to attack the harness can
forge that report (it runs in the same process as the reporter); literal checks it can
only pass by computing the value. Without namespaces (e.g. a container without
CAP_SYS_ADMIN and without user namespaces) there is NO network isolation, /tmp and other
world-writable places stay writable, and, when not root, the code runs as you, with
your files: `run_tests` logs a warning once when namespaces are missing.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("tinyrl.rewards.sandbox")
CHILD_SCRIPT = str(Path(__file__).with_name("_sandbox_child.py"))
PRELOAD = ["collections", "itertools", "functools", "math", "re", "string", "heapq", "bisect", "typing",
           "copy", "operator", "fractions", "decimal", "statistics", "random", "datetime", "json"]
_warned: set[str] = set()


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


@dataclass
class Check:
    src: str  # what the child evaluates (kind equal/truthy/falsy) or runs (kind "run")
    kind: str  # "equal" / "io": compare to `expected` in the host; "truthy" / "falsy"; "run": no exception
    expected: Any = None
    line: str = ""  # the grader's original statement, for reports


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


def _literal(node: ast.AST):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _inline_check(body: list[ast.stmt], entry_point: str | None) -> list[ast.stmt]:
    """HumanEval style: the asserts of `def check(candidate)` become top-level, `candidate` -> entry_point
    (by default the name the tests pass to `check(...)`)."""
    for stmt in body:
        if (not entry_point and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"
                and len(stmt.value.args) == 1 and isinstance(stmt.value.args[0], ast.Name)):
            entry_point = stmt.value.args[0].id
    if not entry_point:
        return body
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "check" and stmt.args.args:
            param = stmt.args.args[0].arg

            class Rename(ast.NodeTransformer):
                def visit_Name(self, node):
                    return ast.copy_location(ast.Name(entry_point, node.ctx), node) if node.id == param else node

            out += [ast.fix_missing_locations(Rename().visit(s)) for s in stmt.body]
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
              and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check"):
            continue  # the `check(f)` call: its body is inlined above
        else:
            out.append(stmt)
    return out


def _io_lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in str(text).strip().splitlines()]


def parse_tests(tests: str | list | dict, entry_point: str | None = None) -> tuple[list[dict], list[Check]]:
    """Grader tests -> (steps for the child, checks).

    Assert statements become checks; other top-level statements (imports, helpers) run as
    setup, in order. A list of {"input": ..., "output": ...} dicts makes stdin/stdout checks
    (the program runs once per case; output compared line by line, trailing spaces ignored),
    as does APPS' {"inputs": [...], "outputs": [...]} (a dict or its JSON text).

    >>> steps, checks = parse_tests(["assert add(2, 2) == 4", "assert not add(0, 0)"])
    >>> [(c.kind, c.src, c.expected) for c in checks]
    [('equal', 'add(2, 2)', 4), ('falsy', 'add(0, 0)', None)]
    """
    if isinstance(tests, str) and tests.lstrip().startswith("{"):
        tests = json.loads(tests)  # APPS / CodeContests store {"inputs": [...], "outputs": [...]} as JSON
    if isinstance(tests, dict):
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    if isinstance(tests, list) and tests and all(isinstance(t, dict) for t in tests):
        checks = [Check(str(t["input"]), "io", _io_lines(t["output"]), f"io case {k}") for k, t in enumerate(tests)]
        return [{"kind": "io", "i": k, "src": c.src} for k, c in enumerate(checks)], checks
    source = tests if isinstance(tests, str) else "\n".join(tests)
    body = _inline_check(ast.parse(source).body, entry_point)
    steps: list[dict] = []
    checks: list[Check] = []
    for stmt in body:
        line = ast.unparse(stmt)
        if isinstance(stmt, ast.Assert) and _literal(stmt.test)[0]:
            continue  # `assert True` (HumanEval has them) tests nothing: it would give free credit
        if isinstance(stmt, ast.Assert):
            t = stmt.test
            check = Check(ast.unparse(t), "truthy", line=line)
            if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
                for expr, other in ((t.left, t.comparators[0]), (t.comparators[0], t.left)):
                    ok, value = _literal(other)
                    if ok and not _literal(expr)[0]:
                        check = Check(ast.unparse(expr), "equal", value, line)
                        break
            elif isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
                check = Check(ast.unparse(t.operand), "falsy", line=line)
            steps.append({"kind": "eval", "i": len(checks), "src": check.src})
            checks.append(check)
        elif any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            checks.append(Check(line, "run", line=line))
            steps.append({"kind": "exec", "i": len(checks) - 1, "src": line})
        else:
            steps.append({"kind": "exec", "src": line})
    return steps, checks


def _decode(v):
    if isinstance(v, dict):
        (tag, items), = v.items()
        if tag == "D":
            return {_decode(k): _decode(x) for k, x in items}
        if tag == "B":
            return bytes.fromhex(items)
        if tag == "C":
            return complex(*items)
        items = [_decode(x) for x in items]
        return {"L": list, "T": tuple, "S": set, "F": frozenset}[tag](items)
    return v


def _judge(check: Check, msg: dict) -> bool:
    if "err" in msg:
        return False
    if check.kind == "run":
        return msg.get("ok") is True
    if "v" not in msg:
        return False
    try:
        value = _decode(msg["v"])
        if check.kind == "equal":
            return bool(value == check.expected)
        if check.kind == "io":
            return type(value) is str and _io_lines(value) == check.expected
        return bool(value) if check.kind == "truthy" else not bool(value)
    except Exception:  # malformed report: the check fails
        return False


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
              limits: Limits | None = None, hide: list[str] | None = None, namespaces: bool = True) -> SandboxResult:
    """Run `code`, then the grader's `tests` in the sandbox; one pass/fail per check.

    `tests`: assert statements, HumanEval's `def check(candidate)` (with `entry_point`), or
    stdin/stdout cases (see `parse_tests`). `hide`: directories to cover (default: home
    directories and the current directory). `namespaces=False` skips the namespaces
    (rlimits and the uid only), as on a host that does not allow them.
    """
    limits = limits or Limits()
    steps, checks = parse_tests(tests, entry_point)
    root = os.geteuid() == 0
    uid = _pick_uid() if root else os.getuid()
    workdir = tempfile.mkdtemp(prefix="tinyrl-sbx-")  # its working directory only where there is no mount namespace
    if root:
        os.chown(workdir, uid, uid)
    os.chmod(workdir, 0o700)
    job = {"code": code, "steps": steps, "io": any(c.kind == "io" for c in checks), "limits": vars(limits),
           "uid": uid, "gid": uid, "workdir": workdir, "hide": _default_hide() if hide is None else hide,
           "preload": PRELOAD, "namespaces": namespaces}
    r, w = os.pipe()
    job["report_fd"] = w
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen([sys.executable, "-I", CHILD_SCRIPT], stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, pass_fds=(w,), close_fds=True, start_new_session=True,
                                    cwd=workdir, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"})
        except OSError as e:
            os.close(r), os.close(w), shutil.rmtree(workdir, ignore_errors=True)
            return SandboxResult("error", [False] * len(checks), load_error=f"could not start the sandbox: {e}")
        os.close(w)
        try:
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except OSError:
                pass  # it died at once; the report says so
            backstop = start + limits.wall_s + 10.0  # the supervisor keeps the wall time; start-up can be slow
            msgs, done = _read_reports(r, backstop, limits.report_bytes)
        finally:
            os.close(r)
            _stop(proc)
            shutil.rmtree(workdir, ignore_errors=True)
        wall = time.monotonic() - start
        out.seek(0)
        output = out.read(limits.output_bytes + 1)
    return _result(msgs, done, checks, output, wall, limits)


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


def _read_reports(fd: int, deadline: float, max_bytes: int) -> tuple[list[dict], bool]:
    buf, total, msgs = b"", 0, []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return msgs, False
        chunk = os.read(fd, 65536)
        if not chunk:
            return msgs, False
        total += len(chunk)
        if total > max_bytes:
            return msgs, False
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            try:
                msg = json.loads(ln)
            except Exception:
                continue  # garbage on the pipe (the code wrote there): ignored
            if isinstance(msg, dict):
                msgs.append(msg)
                if msg.get("done") is True or "worker_exit" in msg:
                    return msgs, msg.get("done") is True


def _result(msgs, done, checks, output: bytes, wall, limits) -> SandboxResult:
    ready = msgs[0] if msgs and "ready" in msgs[0] else {}
    iso = ready.get("ready", {}) if isinstance(ready.get("ready"), dict) else {}
    _warn_isolation(iso)
    passed, seen = [False] * len(checks), set()
    load_error = ready.get("fatal")
    exit_code = None
    for msg in msgs[1:]:
        i = msg.get("i")
        if isinstance(i, int) and 0 <= i < len(checks) and i not in seen:  # first report of a check counts
            seen.add(i)
            passed[i] = _judge(checks[i], msg)
        elif "load_error" in msg and load_error is None:
            load_error = str(msg["load_error"])
        elif "worker_exit" in msg:
            exit_code = msg["worker_exit"]
    if len(output) > limits.output_bytes:
        status = "output_limit"
    elif not ready:
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
    missing = [k for k in ("net", "mount", "pid") if iso and not iso.get(k)]
    key = ",".join(missing)
    if not missing or key in _warned:
        return
    _warned.add(key)
    what = []
    if "net" in missing:
        what.append("the network is NOT isolated")
    if "mount" in missing:
        what.append("files are protected only by permissions" if iso.get("root")
                    else "the code runs as your user and can read and write your files")
    log.warning("code sandbox: no %s namespace here; %s", "/".join(missing), "; ".join(what) or "see tinyrl.rewards.sandbox")
