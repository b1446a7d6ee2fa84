"""The lockdown half of the sandbox child: the file system it sees and the system calls it may make.

Loaded by path from `_sandbox_child.py` (stdlib only, never the tinyrl package) while the
child is still trusted. Two layers, each reported in the child's "ready" line:

- `setup_mounts` (in a new mount namespace): every mount read-only; private directories
  and socket locations (/run, /var/run) covered by empty tmpfs with Python's import paths
  bound back; a fresh /tmp; a minimal /dev (null, zero, random, urandom, a fresh shm, the
  fd symlinks); and every filesystem UNIX socket the host had bound (read from
  /proc/net/unix before the network was unshared) covered by /dev/null, so `connect()`
  finds no socket there.
- `install_seccomp` (in the worker, after no_new_privs, whatever namespaces it got): a
  seccomp filter that refuses (EPERM) `socket()` of every family, `socketpair()` other
  than AF_UNIX/SOCK_STREAM (a connected pair cannot be pointed at a path), SysV IPC
  (shm/msg/sem) and POSIX message queues, io_uring (it could open sockets behind the
  filter's back), truncate(2) by path (Landlock before ABI 3 does not cover it; ftruncate of a
  file it opened for writing stays allowed), and namespace and mount calls (unshare, setns, mount, clone with
  namespace flags; clone3 answers ENOSYS so libc falls back to clone). Other
  architectures' system calls (i386 `int 0x80`, x32) are refused. Only x86_64 and
  aarch64 get a filter; elsewhere the layer is reported missing.
"""

import ctypes
import os
import platform
import stat
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (0x00020000, 0x08000000, 0x10000000,
                                                                        0x20000000, 0x40000000)
_CLONE_NS_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
_MOUNT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
SOCKET_DIRS = ("/run", "/var/run")  # where daemons keep their sockets (dbus, systemd, docker, ...)
DEV_NODES = ("null", "zero", "random", "urandom")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def host_unix_sockets(limit: int = 4096) -> list[str]:
    """Paths of the filesystem UNIX sockets bound in this network namespace (call before unsharing it)."""
    try:
        with open("/proc/net/unix") as f:
            rows = [ln.split() for ln in list(f)[1:]]
    except OSError:
        return []
    return sorted({r[7] for r in rows if len(r) >= 8 and r[7].startswith("/")})[:limit]


def _traversable(path: str, uid: int, gid: int) -> bool:
    st = os.stat(path)
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    return bool(st.st_mode & bit)


def _read_only_everything() -> None:
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


def _hide(hide: set, keep: list[str]) -> None:
    """Cover each directory in `hide` with an empty read-only tmpfs, binding back what `keep` needs."""
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


def _minimal_dev(shm_size: str) -> None:
    """A fresh /dev holding only the harmless nodes (bound from the host's), the fd links and a fresh shm."""
    fds = {n: os.open(f"/dev/{n}", os.O_PATH) for n in DEV_NODES if os.path.exists(f"/dev/{n}")}
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name, fd in fds.items():
        os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
        mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
        os.close(fd)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"{shm_size},mode=1777")
    mount(None, "/dev", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def _cover_sockets(paths: list[str]) -> tuple[int, int]:
    """Bind /dev/null over every socket in `paths` still visible; (covered, left) counts."""
    covered = left = 0
    for p in paths:
        try:
            if not stat.S_ISSOCK(os.lstat(p).st_mode):
                continue
        except OSError:
            continue  # gone, or under a hidden directory
        try:
            mount("/dev/null", p, None, MS_BIND)
            covered += 1
        except OSError:
            left += 1
    return covered, left


def setup_mounts(job: dict, uid: int, gid: int, sockets: list[str]) -> dict:
    """Read-only everything, hide private directories and socket locations, fresh /tmp, minimal /dev."""
    _read_only_everything()
    keep = [os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)]
    hide = {os.path.realpath(p) for p in list(job.get("hide", [])) + list(SOCKET_DIRS) if os.path.isdir(p)}
    for k in keep:  # a directory the sandbox user cannot enter, above Python's own library
        parts = k.split("/")
        for n in range(2, len(parts) + 1):
            d = "/".join(parts[:n])
            if not _traversable(d, uid, gid):
                hide.add(d)
                break
    _hide(hide, keep)
    size = f"size={int(job['limits']['tmp_mb'])}m"
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=700,uid={uid},gid={gid}")
    _minimal_dev(size)
    covered, left = _cover_sockets(sockets)
    return {"dev": True, "sockets_covered": covered, "sockets_left": left}


# --------------------------------------------------------------------------- seccomp

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_LD_ABS, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
_AF_UNIX, _SOCK_STREAM, _X32_BIT = 1, 1, 0x40000000
_DENIED = ("socket", "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget",
           "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
           "mq_getsetattr", "io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "setns", "mount",
           "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsmount", "fspick", "mount_setattr",
           "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "ptrace", "truncate")
# Linux system call numbers (asm/unistd_64.h on x86_64; asm-generic/unistd.h on aarch64).
_X86_64 = dict(socket=41, socketpair=53, shmget=29, shmat=30, shmctl=31, shmdt=67, semget=64, semop=65, semctl=66,
               semtimedop=220, msgget=68, msgsnd=69, msgrcv=70, msgctl=71, mq_open=240, mq_unlink=241,
               mq_timedsend=242, mq_timedreceive=243, mq_notify=244, mq_getsetattr=245, unshare=272, setns=308,
               mount=165, umount2=166, pivot_root=155, bpf=321, perf_event_open=298, userfaultfd=323, keyctl=250,
               add_key=248, request_key=249, ptrace=101, clone=56, truncate=76)
_AARCH64 = dict(socket=198, socketpair=199, shmget=194, shmat=196, shmctl=195, shmdt=197, semget=190, semop=193,
                semctl=191, semtimedop=192, msgget=186, msgsnd=189, msgrcv=188, msgctl=187, mq_open=180,
                mq_unlink=181, mq_timedsend=182, mq_timedreceive=183, mq_notify=184, mq_getsetattr=185, unshare=97,
                setns=268, mount=40, umount2=39, pivot_root=41, bpf=280, perf_event_open=241, userfaultfd=282,
                keyctl=219, add_key=217, request_key=218, ptrace=117, clone=220, truncate=45)
_COMMON = dict(io_uring_setup=425, io_uring_enter=426, io_uring_register=427, open_tree=428, move_mount=429,
               fsopen=430, fsmount=432, fspick=433, clone3=435, mount_setattr=442)
ARCHES = {"x86_64": (0xC000003E, {**_X86_64, **_COMMON}), "aarch64": (0xC00000B7, {**_AARCH64, **_COMMON})}


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def _arg(i: int) -> int:
    return 16 + 8 * i  # low 32 bits of seccomp_data.args[i] (little-endian)


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) BPF instructions; jumps are resolved from labels."""
    audit_arch, nr = ARCHES[machine]
    prog: list = [(_LD_ABS, 0, 0, 4), (_JEQ, 0, "deny", audit_arch), (_LD_ABS, 0, 0, 0)]
    if machine == "x86_64":
        prog.append((_JGE, "deny", 0, _X32_BIT))
    prog += [(_JEQ, "deny", 0, nr[name]) for name in _DENIED]
    prog += [(_JEQ, "enosys", 0, nr["clone3"]), (_JEQ, "pair", 0, nr["socketpair"]),
             (_JEQ, "clone", 0, nr["clone"]), (_RET, 0, 0, _RET_ALLOW)]
    labels = {"pair": len(prog)}
    prog += [(_LD_ABS, 0, 0, _arg(0)), (_JEQ, 0, "deny", _AF_UNIX), (_LD_ABS, 0, 0, _arg(1)), (_AND, 0, 0, 0xF),
             (_JEQ, "allow", "deny", _SOCK_STREAM)]
    labels["clone"] = len(prog)
    prog += [(_LD_ABS, 0, 0, _arg(0)), (_JSET, "deny", "allow", _CLONE_NS_FLAGS)]
    labels.update(allow=len(prog), deny=len(prog) + 1, enosys=len(prog) + 2)
    prog += [(_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, _RET_ERRNO | _EPERM), (_RET, 0, 0, _RET_ERRNO | _ENOSYS)]

    def rel(i: int, target) -> int:
        return target if isinstance(target, int) else labels[target] - i - 1

    return [(code, rel(i, jt), rel(i, jf), k) for i, (code, jt, jf, k) in enumerate(prog)]


def install_seccomp() -> tuple[bool, str]:
    """Install the filter on this process (no_new_privs must be set); (installed, why not)."""
    machine = platform.machine()
    if machine not in ARCHES:
        return False, f"no seccomp filter for {machine}"
    insns = seccomp_program(machine)
    arr = (_Insn * len(insns))(*[_Insn(*i) for i in insns])
    prog = _Prog(len(insns), arr)
    ret = _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                      ctypes.c_ulong(ctypes.addressof(prog)), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if ret != 0:
        return False, f"seccomp: {os.strerror(ctypes.get_errno())}"
    return True, ""
