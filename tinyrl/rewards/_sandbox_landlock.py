"""Landlock: the sandbox's file-system layer where it gets no mount namespace.

Loaded by path from `_sandbox_child.py` (stdlib only, never the tinyrl package). Landlock (Linux 5.13+)
lets any process, without privileges (no_new_privs set), take away its own access to files for good;
Docker's default seccomp profile allows its three system calls (moby#43199, 2022), so a container without
CAP_SYS_ADMIN, where namespaces are refused (Colab, Kaggle, RunPod, vast.ai), still has it.

`restrict(read, write, hide)` lets the process (and every process it forks) open only:

- for reading (and listing, and mapping as executable): the directories in `read` (the system's:
  /usr, /lib*, /bin, /sbin, /etc; Python's prefix and import paths), except any `hide` path under
  them (their other entries are allowed one by one); /dev/null (read and write), /dev/zero,
  /dev/random and /dev/urandom;
- for anything (create, write, remove, rename within): the directories in `write` (the run's own
  working directory);
- nothing else: not /proc, /sys, /tmp, /var, /run, /home, /root, /mnt, /srv, not the host's
  working directory. And from ABI 4 no TCP bind or connect, from ABI 6 no signal to a process
  outside the sandbox and no abstract UNIX socket outside it (on top of the seccomp filter).

What it does not cover (docs/rewards.md): before ABI 3 (Linux 6.2) truncate(2) of a file it may only
read (the seccomp filter refuses truncate(2) for that); before ABI 5 (6.10) ioctl on the devices it
may open; the amount it writes into its working directory (RLIMIT_FSIZE caps each file, not the sum).
"""

import ctypes
import os

CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446  # the same number on every architecture but alpha
_VERSION, _RULE_PATH_BENEATH = 1, 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MAKE_CHAR, MAKE_SOCK, MAKE_BLOCK, TRUNCATE, IOCTL_DEV = 1 << 6, 1 << 9, 1 << 11, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}  # ABI 5+: (1 << 16) - 1
_NET_TCP = 3  # BIND_TCP | CONNECT_TCP (ABI 4+)
_SCOPES = 3  # ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6+)
READ = EXECUTE | READ_FILE | READ_DIR
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # what a rule on a file (not a directory) may hold
DEVICES = {"/dev/null": READ_FILE | WRITE_FILE, "/dev/zero": READ_FILE, "/dev/random": READ_FILE,
           "/dev/urandom": READ_FILE}
SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc")
MAX_RULES = 1024

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (an old kernel, Landlock not enabled at
    boot, or a seccomp profile that refuses the call)."""
    v = _libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    return max(int(v), 0)


def _fs_rights(version: int) -> int:
    return _FS_BY_ABI.get(version, (1 << 16) - 1)


def _readable(read: list[str], hide: list[str]) -> list[str]:
    """`read`'s directories, with each `hide` path under one of them cut out (its siblings allowed one by one)."""
    hide = [os.path.realpath(h) for h in hide]
    out: list[str] = []

    def add(path: str, depth: int) -> None:
        if path in hide or len(out) >= MAX_RULES:
            return
        if not any(h.startswith(path.rstrip("/") + "/") for h in hide):
            out.append(path)
            return
        if depth >= 8:  # too deep to cut out: left out entirely (fail closed)
            return
        try:
            entries = sorted(os.listdir(path))
        except OSError:
            return
        for e in entries:
            add(os.path.join(path, e), depth + 1)

    for p in dict.fromkeys(os.path.realpath(p) for p in read):
        if os.path.exists(p):
            add(p, 0)
    return out


def restrict(read: list[str], write: list[str], hide: list[str]) -> dict:
    """Restrict this process for good (no_new_privs must be set); what it got, for the "ready" line.
    Raises OSError when Landlock is there but the restriction fails (the caller then runs nothing)."""
    version = abi()
    if version < 1:
        raise OSError("Landlock is not available")
    fs = _fs_rights(version)
    attr = _RulesetAttr(fs, _NET_TCP if version >= 4 else 0, _SCOPES if version >= 6 else 0)
    size = 24 if version >= 6 else 16 if version >= 4 else 8
    ruleset = _libc.syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    rules = [(p, READ) for p in _readable(read, hide)] + list(DEVICES.items())
    rules += [(os.path.realpath(w), fs & ~(MAKE_CHAR | MAKE_BLOCK | MAKE_SOCK)) for w in write]
    added = 0
    try:
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not there (or not reachable): nothing to allow
            try:
                if not os.path.isdir(path):
                    access &= FILE_RIGHTS
                rule = _PathBeneath(access & fs, fd)
                if _libc.syscall(ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                                 ctypes.c_uint32(0)) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"landlock_add_rule {path}: {os.strerror(err)}")
                added += 1
            finally:
                os.close(fd)
        if _libc.syscall(RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)
    return {"landlock": version, "landlock_rules": added}
