"""The child side of `tinyrl.rewards.sandbox`: isolate, drop privileges, run, report.

Started by path as `python -I _sandbox_child.py` (stdlib only, never the tinyrl package;
`_sandbox_lockdown.py` beside it is loaded by path). It reads one JSON job from stdin,
then, while still trusted:

1. notes the host's bound UNIX sockets, then unshares network, mount, PID and IPC
   namespaces (plus a user namespace when not root),
2. in the new mount namespace (`_sandbox_lockdown.setup_mounts`): makes every mount
   read-only, hides `hide` paths, /run and /var/run (and any directory the sandbox user
   could not enter that holds Python's own library) under empty read-only tmpfs with
   Python's import paths bound back, gives it a minimal /dev, covers the host's sockets,
   and mounts a fresh tmpfs on /tmp as the working directory,
3. becomes PID 1 of the new PID namespace (the supervisor) and forks the worker, which
   sets rlimits, drops to the sandbox uid (or drops all capabilities in a user
   namespace), sets no_new_privs, installs the seccomp filter, and only then runs the
   untrusted code and the checks.

Each result is one JSON line on the report pipe. The first line ("ready") is written
before any untrusted code runs, so the parent can trust what it says about isolation.
The supervisor enforces the wall-clock limit, then kills everything that is left.
"""

import builtins
import ctypes
import json
import os
import signal
import sys
import time

PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 24, 36, 38
_libc = ctypes.CDLL(None, use_errno=True)


def _load_lockdown():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_lockdown.py")
    spec = importlib.util.spec_from_file_location("_sandbox_lockdown", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lockdown = _load_lockdown()
_check, mount = lockdown.check, lockdown.mount


def _unshare(job: dict) -> dict:
    """Enter new namespaces; returns which ones we got."""
    ld = lockdown
    root = os.geteuid() == 0
    flags = {"net": ld.CLONE_NEWNET, "mount": ld.CLONE_NEWNS, "pid": ld.CLONE_NEWPID, "ipc": ld.CLONE_NEWIPC}
    want = sum(flags.values()) | (0 if root else ld.CLONE_NEWUSER)
    got = {"net": False, "mount": False, "pid": False, "ipc": False, "userns": False}
    uid, gid = os.getuid(), os.getgid()
    if not job.get("namespaces", True):
        return got
    if _libc.unshare(want) == 0:
        got.update({name: True for name in flags}, userns=not root)
    elif root:
        for name, flag in flags.items():
            got[name] = _libc.unshare(flag) == 0
    if got["userns"]:  # become root of the new user namespace (mapped to our own uid outside)
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return got


def _drop_privileges(job: dict, iso: dict) -> None:
    import resource

    lim = job["limits"]
    cpu = max(1, int(lim["cpu_s"] + 0.999))
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, int(lim["memory_mb"]) << 20),
                       (resource.RLIMIT_FSIZE, int(lim["file_bytes"])), (resource.RLIMIT_NOFILE, int(lim["nofile"])),
                       (resource.RLIMIT_NPROC, int(lim["nproc"])), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_MSGQUEUE, 0)):
        resource.setrlimit(res, (value, value))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if iso["root"]:
        uid, gid = job["uid"], job["gid"]
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise RuntimeError("privileges were not dropped")
    else:  # user namespace (or plain user): drop every capability we hold in it
        for cap in range(64):
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        _check(_libc.capset(header, data), "capset")
    iso["seccomp"], why = lockdown.install_seccomp()
    if why:
        iso["seccomp_error"] = why


def _encode(v, depth: int = 0):
    """Plain data only, by exact type (a subclass with a lying __eq__ does not pass)."""
    if depth > 50:
        raise ValueError("value nested too deeply")
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if t in (list, tuple, set, frozenset):
        items = [_encode(x, depth + 1) for x in v]
        return {{list: "L", tuple: "T", set: "S", frozenset: "F"}[t]: items}
    if t is dict:
        return {"D": [[_encode(k, depth + 1), _encode(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"B": v.hex()}
    if t is complex:
        return {"C": [v.real, v.imag]}
    raise TypeError(f"a {t.__name__} is not plain data")


def _run_io(code, stdin: str) -> str:
    """Run `code` as a script on `stdin`; its stdout (a clean exit via sys.exit(0) is fine)."""
    import io

    saved = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = io.StringIO(stdin), io.StringIO()
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})  # noqa: S102 (the sandbox's job)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        out = sys.stdout.getvalue() if isinstance(sys.stdout, io.StringIO) else ""
        sys.stdin, sys.stdout = saved
    return out


def _run(job: dict, say) -> None:
    """The untrusted part: the model's code, then the grader's steps, each result reported."""
    ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        code = compile(job["code"], "solution.py", "exec")
        if not job.get("io"):
            exec(code, ns)  # noqa: S102
    except BaseException as e:  # noqa: BLE001 (SystemExit included: exiting early fails)
        _flush()
        say({"load_error": f"{type(e).__name__}: {e}"[:300]})
        return
    for step in job["steps"]:
        i = step.get("i")
        try:
            if step["kind"] in ("eval", "io"):
                value = eval(step["src"], ns) if step["kind"] == "eval" else _run_io(code, step["src"])  # noqa: S307
                line = json.dumps({"i": i, "v": _encode(value)})
                if len(line) > job["limits"]["value_bytes"]:
                    raise ValueError("value too large")
                say(line)
            else:
                exec(step["src"], ns)  # noqa: S102
                if i is not None:
                    say({"i": i, "ok": True})
        except BaseException as e:  # noqa: BLE001
            if i is not None:
                say({"i": i, "err": f"{type(e).__name__}: {e}"[:200]})
    _flush()
    say({"done": True})


def _flush() -> None:
    """Flush the code's prints before the last report (the host stops reading at "done")."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 (the code may have replaced or closed them)
            pass


def _wait(pid: int, wall_s: float) -> int:
    """Wait for `pid` up to `wall_s` (reaping any orphan handed to us); kill it at the deadline."""
    deadline = time.monotonic() + wall_s
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done == pid:
            return status
        if done:
            continue  # an orphan of the worker (we are PID 1 of the namespace)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.005)


def _reap_uid(uid: int) -> None:
    """Kill every process of the sandbox uid: fork, become that uid, kill(-1) until none is left."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            for _ in range(1000):
                os.kill(-1, signal.SIGKILL)  # as this uid: every process of the uid but ourselves
        except (ProcessLookupError, OSError):
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def main() -> None:
    job = json.loads(sys.stdin.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    rep = job["report_fd"]

    def say(msg) -> None:
        line = msg if isinstance(msg, str) else json.dumps(msg)
        try:
            os.write(rep, (line + "\n").encode())
        except OSError:  # the host stopped reading (it has what it needs)
            pass

    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    root, host_uid = os.geteuid() == 0, os.getuid()
    child = {"pid": 0}  # the process a SIGTERM from the host should kill (PID 1 of the namespace, or the worker)

    def stop(signum, frame):  # the host is done with us: end the run now, cleanly
        try:
            if child["pid"]:
                os.kill(child["pid"], signal.SIGKILL)
        except OSError:  # it has already ended
            pass

    signal.signal(signal.SIGTERM, stop)
    sockets = lockdown.host_unix_sockets()  # read in the host's network namespace, before leaving it
    iso = _unshare(job)
    iso["root"] = root
    iso["uid"] = job["uid"] if root else host_uid
    uid, gid = (job["uid"], job["gid"]) if root else (0, 0) if iso["userns"] else (os.getuid(), os.getgid())
    if iso["pid"]:
        child["pid"] = os.fork()
        if child["pid"]:  # the outer process waits for PID 1 of the new namespace, whose exit ends them all
            os.waitpid(child["pid"], 0)
            os._exit(0)
        child["pid"] = 0
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if iso["mount"]:
        try:
            iso.update(lockdown.setup_mounts(job, uid, gid, sockets))
            if iso["pid"]:
                ld = lockdown
                mount("proc", "/proc", "proc", ld.MS_NOSUID | ld.MS_NODEV | ld.MS_NOEXEC)
            os.chdir("/tmp")
        except OSError as e:
            iso["mount"] = False
            iso["mount_error"] = str(e)
    if not iso["mount"]:
        os.chdir(job["workdir"])
    for name in job.get("preload", []):
        try:
            __import__(name)
        except Exception:
            pass
    worker = os.fork()
    if worker == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.setpgid(0, 0)
            _drop_privileges(job, iso)
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # writing past the file limit ends the run
        except BaseException as e:  # noqa: BLE001
            say({"ready": iso, "fatal": f"{type(e).__name__}: {e}"})
            os._exit(1)
        say({"ready": iso})
        _run(job, say)
        os._exit(0)
    if not iso["pid"]:
        child["pid"] = worker
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the worker come to us, to be reaped
    status = _wait(worker, float(job["limits"]["wall_s"]))
    say({"worker_exit": os.waitstatus_to_exitcode(status)})
    if root and not iso["pid"]:
        _reap_uid(job["uid"])
    elif not iso["pid"]:
        try:
            os.killpg(worker, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # reap what was killed, so no zombie is left behind
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.005)
        except ChildProcessError:
            break
    os._exit(0)


if __name__ == "__main__":
    main()
