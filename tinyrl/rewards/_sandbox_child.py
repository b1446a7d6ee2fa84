"""The child side of `tinyrl.rewards.sandbox`: isolate, drop privileges, run, report.

Started by path as `python -I _sandbox_child.py` (stdlib only, never the tinyrl package).
It reads one JSON job from stdin, then, while still trusted:

1. unshares network, mount and PID namespaces (plus a user namespace when not root),
2. in the new mount namespace: makes every mount read-only, hides `hide` paths (and any
   directory the sandbox user could not enter that holds Python's own library) under empty
   read-only tmpfs with Python's import paths bound back, and mounts a fresh tmpfs on
   /tmp and /dev/shm as the working directory,
3. becomes PID 1 of the new PID namespace (the supervisor) and forks the worker, which
   sets rlimits, drops to the sandbox uid (or drops all capabilities in a user
   namespace), sets no_new_privs, and only then runs the untrusted code and the checks.

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

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
_MOUNT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 24, 36, 38
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _traversable(path: str, uid: int, gid: int) -> bool:
    st = os.stat(path)
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    return bool(st.st_mode & bit)


def _unshare(job: dict) -> dict:
    """Enter new namespaces; returns which ones we got."""
    root = os.geteuid() == 0
    want = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | (0 if root else CLONE_NEWUSER)
    got = {"net": False, "mount": False, "pid": False, "userns": False}
    uid, gid = os.getuid(), os.getgid()
    if not job.get("namespaces", True):
        return got
    if _libc.unshare(want) == 0:
        got.update(net=True, mount=True, pid=True, userns=not root)
    elif root:
        for name, flag in (("net", CLONE_NEWNET), ("mount", CLONE_NEWNS), ("pid", CLONE_NEWPID)):
            got[name] = _libc.unshare(flag) == 0
    if got["userns"]:  # become root of the new user namespace (mapped to our own uid outside)
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return got


def _setup_mounts(job: dict, uid: int, gid: int) -> None:
    """Read-only everything, hide private directories, fresh tmpfs for /tmp and /dev/shm."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    with open("/proc/self/mountinfo") as f:
        mounts = [(ln.split()[4], ln.split()[5]) for ln in f]
    for point, opts in mounts:
        if point.startswith(("/proc", "/sys", "/dev")):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for o in opts.split(","):
            flags |= _MOUNT_FLAGS.get(o, 0)
        try:
            mount(None, point, None, flags)
        except OSError:
            pass
    keep = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
    hide = set(os.path.realpath(p) for p in job.get("hide", []) if os.path.isdir(p))
    for k in keep:  # a directory the sandbox user cannot enter, above Python's own library
        parts = k.split("/")
        for n in range(2, len(parts) + 1):
            d = "/".join(parts[:n])
            if not _traversable(d, uid, gid):
                hide.add(d)
                break
    for h in sorted(hide, key=len):
        if h == "/" or h in keep:
            continue
        if any(h.startswith(o + "/") for o in hide if o != h and o != "/"):
            continue  # already under a hidden parent
        under = [k for k in keep if k.startswith(h + "/")]
        fds = [os.open(k, os.O_PATH | os.O_DIRECTORY) for k in under]
        mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for k, fd in zip(under, fds):
            os.makedirs(k, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", k, None, MS_BIND | MS_REC)
            os.close(fd)
        mount(None, h, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    size = f"size={int(job['limits']['tmp_mb'])}m"
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=700,uid={uid},gid={gid}")
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")


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
            _setup_mounts(job, uid, gid)
            if iso["pid"]:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
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
