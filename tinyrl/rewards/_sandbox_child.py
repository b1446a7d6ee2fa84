"""The child side of `tinyrl.rewards.sandbox`: isolate, drop privileges, run, report.

Started by path as `python -I _sandbox_child.py` (stdlib only, never the tinyrl package;
`_sandbox_lockdown.py`, `_sandbox_landlock.py`, `_sandbox_procs.py`, `_sandbox_values.py` and
`_sandbox_judge.py` beside it are loaded by path). It reads one JSON job from stdin, then, while still trusted:

1. notes the host's bound UNIX sockets, then unshares network, mount, PID and IPC
   namespaces (plus a user namespace when not root; one at a time where the host refuses
   some of them),
2. in the new mount namespace (`_sandbox_lockdown.setup_mounts`): makes every mount
   read-only, hides `hide` paths, /run and /var/run (and any directory the sandbox user
   could not enter that holds Python's own library) under empty read-only tmpfs with
   Python's import paths bound back, gives it a minimal /dev, covers the host's sockets,
   and mounts a fresh tmpfs on /tmp as the working directory. Without a mount namespace
   the file layer is Landlock (`_sandbox_landlock`) where the kernel has it, else as root
   a chroot into the run's own directory; with neither it refuses to go on unless the job
   allows weak isolation,
3. becomes PID 1 of the new PID namespace (the supervisor; without one, the subreaper of
   everything the worker leaves behind) and forks the worker, which closes the report pipe
   and the key pipe, sets rlimits and no_new_privs, restricts itself with Landlock (or
   chroots), drops to the sandbox uid (or drops all capabilities), installs the seccomp
   filter, and only then runs the untrusted code, answering the judge's calls;
4. reads the per-run key (only now: the worker never had it in memory) and forks the judge
   (`_sandbox_judge.py`), which drops its privileges too, becomes non-dumpable, and evaluates
   the grader's steps in its own interpreter, calling into the worker for data
   (`_sandbox_values`).

Each result is one JSON line on the report pipe, signed with the key (HMAC-SHA256); the host
ignores any line it cannot verify. The first line ("ready") is written before any untrusted
code runs, so the parent can trust what it says about isolation. The supervisor enforces the
wall-clock limit, then kills everything that is left.
"""

import builtins
import ctypes
import json
import os
import signal
import sys
import time

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 36, 38
_libc = ctypes.CDLL(None, use_errno=True)


def _load_lockdown(name: str):
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lockdown = _load_lockdown("_sandbox_lockdown")
landlock = _load_lockdown("_sandbox_landlock")
procs = _load_lockdown("_sandbox_procs")
values = sys.modules["_sandbox_values"] = _load_lockdown("_sandbox_values")  # the judge imports it by this name
judging = _load_lockdown("_sandbox_judge")
_check, mount = lockdown.check, lockdown.mount


def _unshare(job: dict) -> dict:
    """Enter new namespaces; returns which ones we got. Not root: a user namespace first (where the host
    allows one), then inside it each other namespace it allows (all at once where possible)."""
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
    elif root or _libc.unshare(ld.CLONE_NEWUSER) == 0:  # one at a time (a user namespace first when not root)
        got["userns"] = not root
        if got["userns"]:
            _map_ids(uid, gid)
        for name, flag in flags.items():
            got[name] = _libc.unshare(flag) == 0
        return got
    if got["userns"]:  # become root of the new user namespace (mapped to our own uid outside)
        _map_ids(uid, gid)
    return got


def _map_ids(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _fs_layer(job: dict, iso: dict) -> str:
    """What keeps the code off the host's files: "mount" (a mount namespace), else "landlock" (where the
    kernel has it), else "chroot" (as root: an empty private root), else "none"."""
    iso["landlock"], iso["chroot"] = 0, False
    if iso["mount"]:
        return "mount"
    iso["landlock"] = landlock.abi() if job.get("landlock", True) else 0
    if iso["landlock"]:
        return "landlock"
    iso["chroot"] = iso["root"] and job.get("chroot", True)
    return "chroot" if iso["chroot"] else "none"


def _drop_privileges(job: dict, iso: dict, uid: int, writable: list[str]) -> None:
    """rlimits, no_new_privs, the file-system layer this process needs itself (Landlock, or chroot into its
    working directory), a uid of its own (as root) or no capability left, then the seccomp filter."""
    import resource

    lim = job["limits"]
    cpu = max(1, int(lim["cpu_s"] + 0.999))
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, int(lim["memory_mb"]) << 20),
                       (resource.RLIMIT_FSIZE, int(lim["file_bytes"])), (resource.RLIMIT_NOFILE, int(lim["nofile"])),
                       (resource.RLIMIT_NPROC, int(lim["nproc"])), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_MSGQUEUE, 0)):
        resource.setrlimit(res, (value, value))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    fs = job["fs"]
    if fs == "landlock":  # before the uid change: the rules' directories are opened while we can still reach them
        iso.update(landlock.restrict(landlock.SYSTEM + tuple(p for p in sys.path if p), writable, job["hide"]))
    elif fs == "chroot" and writable:  # the worker: its working directory becomes its whole file system
        os.chroot(writable[0])
        os.chdir("/")
        os.environ["TMPDIR"] = "/"
        iso["chroot"] = True
    if iso["root"]:
        gid = uid
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


def _answer(value, handles: dict, limit: int) -> dict:
    """A value as the judge gets it: data (`_sandbox_values`, up to `limit` bytes of JSON) in which any
    other object is a handle the judge can use (and which equals nothing); too large: one handle."""

    def hold(v) -> dict:
        handles[len(handles) + 1] = v
        return {"R": [len(handles), type(v).__name__[:100]]}

    try:
        enc = values.encode(value, hold)
        if len(json.dumps(enc)) <= limit:
            return {"v": enc}
    except (TypeError, ValueError, RecursionError):
        pass
    return {"v": hold(value)}


def _request(req, handles: dict, code, limit: int) -> dict:
    """One call of the judge, answered by the solution's objects (its exceptions become "raise")."""

    def arg(x):
        return values.decode(x, lambda ref, name: handles[ref])

    op = next(iter(req))  # the judge's requests have their operation first
    obj = handles[req[op]] if op != "io" else None
    if op == "call":
        return _answer(obj(*arg(req["args"]), **arg(req["kwargs"])), handles, limit)
    if op == "getattr":
        return _answer(getattr(obj, str(req["name"])), handles, limit)
    if op == "setattr":
        setattr(obj, str(req["name"]), arg(req["value"]))
        return {"v": None}
    if op == "getitem":
        return _answer(obj[arg(req["key"])], handles, limit)
    if op == "iter":
        items = []
        for x in obj:
            items.append(x)
            if len(items) > limit:
                raise ValueError("too many items")
        return _answer(items, handles, limit)
    if op == "len":
        return _answer(len(obj), handles, limit)
    if op == "str":
        return _answer(str(obj), handles, limit)
    return _answer(_run_io(code, req["io"]), handles, limit)


def _serve(job: dict, ch) -> None:
    """The untrusted part: load the model's code, then answer the judge's calls until it is done.

    Whatever the code does to this interpreter, what leaves it is data on `ch`: the values its
    functions return. It holds no report pipe and no key."""
    ns = {"__name__": "solution", "__builtins__": builtins}
    handles: dict = {}
    limit = int(job["limits"]["value_bytes"])
    try:
        code = compile(job["code"], "solution.py", "exec")
        if not job.get("io"):
            exec(code, ns)  # noqa: S102
    except BaseException as e:  # noqa: BLE001 (SystemExit included: exiting early fails)
        _flush()
        ch.send({"load_error": f"{type(e).__name__}: {e}"[:300]})
        return
    names = {}
    for name, value in list(ns.items()):
        if not name.startswith("__"):
            names[name] = _answer(value, handles, 1 << 16)
    _flush()  # what it printed reaches the host before the judge can say "done"
    ch.send({"loaded": names})
    while True:
        req = ch.recv()
        try:
            reply = _request(req, handles, code, limit)
        except BaseException as e:  # noqa: BLE001 (the solution's exception, SystemExit included)
            reply = {"raise": [type(e).__name__, str(e)[:200]]}
        _flush()
        ch.send(reply)


def _flush() -> None:
    """Flush the code's prints before the last report (the host stops reading at "done")."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 (the code may have replaced or closed them)
            pass


def main() -> None:
    job = json.loads(sys.stdin.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    rep = job["report_fd"]
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    root, host_uid = os.geteuid() == 0, os.getuid()
    child = {"pids": []}  # what a SIGTERM from the host should kill (PID 1 of the namespace, or worker and judge)

    def stop(signum, frame):  # the host is done with us: end the run now, cleanly
        for pid in child["pids"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # it has already ended
                pass

    signal.signal(signal.SIGTERM, stop)
    sockets = lockdown.host_unix_sockets()  # read in the host's network namespace, before leaving it
    iso = _unshare(job)
    iso["root"] = root
    iso["uid"] = job["uid"] if root else host_uid
    uid, gid = (job["uid"], job["gid"]) if root else (0, 0) if iso["userns"] else (os.getuid(), os.getgid())
    if iso["pid"]:
        pid1 = os.fork()
        if pid1:  # the outer process waits for PID 1 of the new namespace, whose exit ends them all
            child["pids"] = [pid1]
            os.waitpid(pid1, 0)
            os._exit(0)
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
        os.environ["TMPDIR"] = job["workdir"]  # tempfile's directory: its own, not the host's /tmp
    job["fs"] = iso["fs"] = _fs_layer(job, iso)
    # without a mount namespace the code may be unable to read Python's library (a uid of its own, Landlock,
    # a chroot): what it is likely to import is imported now, by the supervisor, and inherited
    for name in job.get("preload", []) + ([] if iso["mount"] else job.get("preload_more", [])):
        try:
            __import__(name)
        except Exception:
            pass
    if job.get("require_fs") and iso["fs"] == "none":  # weak isolation was not allowed: run nothing
        say = judging.signer(_read_key(job["key_fd"]), rep)
        say({"ready": iso, "fatal": "refused: no mount namespace, no Landlock and not root (for a chroot) here, so "
                                    "the code would read your files and write world-writable folders (allow it "
                                    "with weak_isolation=True)"})
        os._exit(0)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no child can reach into this process (ptrace, /proc/<pid>/fd)
    if not iso["pid"]:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the worker come to us, to be killed and reaped
    limit = int(job["limits"]["value_bytes"]) + 4096
    req_r, req_w = os.pipe()  # judge -> worker: the calls
    resp_r, resp_w = os.pipe()  # worker -> judge: plain data
    worker = os.fork()
    if worker == 0:  # never holds the report pipe or the key (not yet read: it is not in this memory)
        for fd in (rep, job["key_fd"], req_w, resp_r):
            os.close(fd)
        ch = judging.Channel(req_r, resp_w, limit)
        mine: dict = {"root": iso["root"]}
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.setpgid(0, 0)
            _drop_privileges(job, mine, job["uid"], [] if iso["mount"] else [job["workdir"]])
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # writing past the file limit ends the run
        except BaseException as e:  # noqa: BLE001
            ch.send({"ready": {}, "fatal": f"{type(e).__name__}: {e}"})
            os._exit(1)
        ch.send({"ready": mine})  # before any untrusted code runs
        try:
            _serve(job, ch)
        except judging.Gone:  # the judge is done
            pass
        _flush()
        os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    say = judging.signer(_read_key(job["key_fd"]), rep)
    judge = os.fork()
    if judge == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _drop_privileges(job, {"root": iso["root"]}, job["judge_uid"], [])
            _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")  # after the uid change, which resets it
        except BaseException as e:  # noqa: BLE001
            say({"ready": iso, "fatal": f"{type(e).__name__}: {e}"})
            os._exit(1)
        judging.run(job, judging.Channel(resp_r, req_w, limit), say, iso)
        os._exit(0)
    os.close(resp_r)
    os.close(req_w)
    if not iso["pid"]:
        child["pids"] = [worker, judge]
    procs.wait(judge, float(job["limits"]["wall_s"]))  # it ends after "done", or once the worker is gone
    status = procs.wait(worker, 0.5)  # ends when the judge's pipe closes; killed otherwise
    say({"worker_exit": os.waitstatus_to_exitcode(status)})
    if root and not iso["pid"]:
        for u in (job["uid"], job["judge_uid"]):
            procs.reap_uid(u)
    elif not iso["pid"]:  # our own uid: kill what descends from us (orphans were handed to us), never by uid
        procs.kill_descendants()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # reap what was killed, so no zombie is left behind
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.005)
        except ChildProcessError:
            break
    os._exit(0)


def _read_key(fd: int) -> bytes:
    """The per-run key the host wrote to its own pipe, read once the worker exists (and cannot have it)."""
    key = b""
    while len(key) < 32:
        chunk = os.read(fd, 32 - len(key))
        if not chunk:
            break
        key += chunk
    os.close(fd)
    return key

if __name__ == "__main__":
    main()
