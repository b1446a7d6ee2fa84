"""The code sandbox: correct code passes; every attack scores 0 and leaves the host untouched."""

import os
import socket
import sys
import tempfile
import time

import pytest

from tinyrl.rewards.code import code_tests_reward, extract_code
from tinyrl.rewards.sandbox import Limits, parse_tests, run_tests

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox uses Linux rlimits and namespaces")

FAST = Limits(cpu_s=1, wall_s=3, memory_mb=256, nproc=4)
LOOP = Limits(cpu_s=1, wall_s=1.2, memory_mb=256, nproc=4)  # for code that never ends
WEAKEST = {"namespaces": False, "landlock": False, "chroot": False, "weak_isolation": True}  # rlimits, uid, seccomp
TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 20) == 30"]
GOOD = "def add(a, b):\n    return a + b\n"


def uid_processes(uid: int) -> list[int]:
    """Host pids whose real uid is `uid` (the sandbox's fresh uid when we run as root)."""
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/status") as f:
                    if any(ln.startswith("Uid:") and int(ln.split()[1]) == uid for ln in f):
                        pids.append(int(p))
            except OSError:
                pass
    return pids


def run(code, tests=TESTS, **kw):
    r = run_tests(code, tests, limits=kw.pop("limits", FAST), **kw)
    if os.geteuid() == 0:  # nothing of the sandbox survives the run
        assert uid_processes(r.isolation.get("uid", -1)) == []
    if r.status == "error" and (r.load_error or "").startswith("refused") and not kw.get("weak_isolation"):
        pytest.skip(f"no mount namespace here, so the sandbox refuses to run: {r.isolation}")
    return r


# --- what should pass -------------------------------------------------------------------------

def test_correct_code_passes_and_partial_credit():
    r = run(GOOD + "print('hello')\n")
    assert r.status == "ok" and r.passed == [True, True, True] and r.score == 1.0
    assert r.output == "hello\n"
    r = run("def add(a, b):\n    return a + b if a < 5 else 0\n")
    assert r.passed == [True, True, False] and r.score == pytest.approx(2 / 3)


def test_isolation_is_reported_and_holds():
    code = ("import os, resource\n"
            "print(os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0], resource.getrlimit(resource.RLIMIT_AS)[0])\n"
            + GOOD)
    r = run(code)
    uid, nproc, mem = (int(x) for x in r.output.split())
    assert nproc == 4 and mem == 256 << 20
    if os.geteuid() == 0:
        assert uid != 0 and uid == r.isolation["uid"]
    if not r.isolation.get("net"):
        pytest.skip(f"no network namespace here: {r.isolation}")
    assert r.isolation["mount"] and r.isolation["pid"]


def test_humaneval_check_and_stdin_stdout_cases():
    check = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n\ncheck(add)\n"
    assert run(GOOD, check, entry_point="add").passed == [True, True]
    assert run(GOOD, check).passed == [True, True]  # entry point read from `check(add)`
    assert parse_tests(check)[1][0].src == "add(2, 3)"  # the expected 5 stays in the host
    io_cases = [{"input": "2 3\n", "output": "5\n"}, {"input": "4 4\n", "output": "8"}]
    script = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert run(script, io_cases).passed == [True, True]
    assert run("print(int(input().split()[0]) * 2)\n", io_cases).passed == [False, True]
    apps = '{"inputs": ["1 2\\n", "5 5\\n"], "outputs": ["3\\n", "10\\n"]}'  # APPS' JSON column
    assert run(script, apps).passed == [True, True]


def test_parse_tests_keeps_literals_in_the_host():
    steps, checks = parse_tests("from math import isclose\nassert add(1, 2) == 3\nassert 3 == add(1, 2)\n"
                                "assert isclose(add(0.1, 0.2), 0.3)\nfor i in range(3):\n    assert add(i, 0) == i\n")
    assert [c.kind for c in checks] == ["equal", "equal", "truthy", "run"]
    assert parse_tests(["assert True", "assert add(1, 1) == 2"])[1][0].src == "add(1, 1)"  # no free credit
    assert [c.expected for c in checks[:2]] == [3, 3]
    assert [s["src"] for s in steps[1:3]] == ["add(1, 2)", "add(1, 2)"]  # the sandbox never sees the 3
    assert steps[0] == {"kind": "exec", "src": "from math import isclose"}


# --- the adversarial suite: each scores 0 and leaves the host untouched -----------------------

def assert_zero(r, *statuses):
    assert r.score == 0.0, r
    if statuses:
        assert r.status in statuses, r


def test_infinite_loops_are_cut_off():
    t0 = time.monotonic()
    assert_zero(run("while True:\n    pass\n" + GOOD, limits=LOOP), "crashed", "timeout")  # CPU limit
    assert_zero(run("import time\ntime.sleep(1000)\n" + GOOD, limits=LOOP), "timeout")  # wall limit
    assert_zero(run("def add(a, b):\n    while True:\n        pass\n", limits=LOOP), "crashed", "timeout")
    assert time.monotonic() - t0 < 15


def test_fork_bomb():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n" + GOOD
    t0 = time.monotonic()
    assert_zero(run(bomb, limits=LOOP), "crashed", "timeout")
    counted = run("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                  "            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
                  "print(n)\n" + GOOD)
    assert int(counted.output) <= 3  # RLIMIT_NPROC = 4 holds (the worker is one); the sleepers are gone
    daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
              "def add(a, b):\n    return a - b\n")
    assert_zero(run(daemon))  # a daemonised child does not outlive the run (run() checks the uid)
    assert time.monotonic() - t0 < 25


def test_memory_bombs():
    t0 = time.monotonic()
    assert_zero(run("x = bytearray(1 << 36)\n" + GOOD), "load_error")
    assert_zero(run("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n" + GOOD))
    assert_zero(run("def add(a, b):\n    return len([0] * (1 << 33))\n"))
    assert time.monotonic() - t0 < 20


@pytest.fixture
def host_files(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    secret = tmp_path / "secret.txt"
    secret.write_text("the hidden answer is 1234")
    secret.chmod(0o644)  # readable by anyone who can reach it
    before = sorted(os.listdir(tmp_path))
    yield tmp_path, victim, secret
    assert victim.read_text() == "original" and secret.exists()
    assert sorted(os.listdir(tmp_path)) == before


def test_writing_or_deleting_outside_its_temp_dir(host_files):
    tmp_path, victim, _ = host_files
    attacks = [
        f"open({str(victim)!r}, 'w').write('pwned')\n",
        f"import os\nos.remove({str(victim)!r})\n",
        f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')\n",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n",
        f"open({os.path.join(os.getcwd(), 'sandbox_was_here.txt')!r}, 'w').write('x')\n",
        "open('/var/tmp/sandbox_was_here.txt', 'w').write('x')\n",
    ]
    for attack in attacks:
        assert_zero(run(attack + GOOD), "load_error")
    assert not os.path.exists(os.path.join(os.getcwd(), "sandbox_was_here.txt"))
    assert not os.path.exists("/var/tmp/sandbox_was_here.txt")
    # its own temp dir works, and is gone afterwards
    r = run("import os\nopen('scratch.txt', 'w').write('ok')\nprint(os.getcwd())\n" + GOOD)
    assert r.score == 1.0
    if r.output.strip() != "/tmp":  # no mount namespace: a host temp dir, removed after the run
        assert not os.path.exists(r.output.strip())


def test_reading_a_file_planted_outside(host_files):
    _, _, secret = host_files
    code = f"SECRET = open({str(secret)!r}).read()\n" + GOOD + "print(SECRET)\n"
    r = run(code)
    assert_zero(r, "load_error")
    assert "1234" not in r.output


def test_network_socket():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = ("import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'leak')\n" + GOOD)
    try:
        r = run(code)
        assert_zero(r, "load_error")
        if r.isolation.get("net"):
            with pytest.raises(socket.timeout):  # nothing ever connected
                server.accept()
        assert_zero(run("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n" + GOOD))
    finally:
        server.close()


def test_exiting_before_the_tests():
    assert_zero(run(GOOD + "import sys\nsys.exit(0)\n"), "load_error")
    assert_zero(run(GOOD + "import os\nos._exit(0)\n"), "crashed")
    assert_zero(run(GOOD + "raise SystemExit\n"), "load_error")
    assert_zero(run("def add(a, b):\n    import os\n    os._exit(0)\n"))


def test_monkeypatching_assert_and_the_runner():
    attacks = [
        # asserts cannot be switched off
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\ndef add(a, b):\n    return 7\n",
        # an object equal to everything is not plain data
        "class Eq:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Eq()\n",
        "class Int(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Int(0)\n",
        # patch the harness and the encoder, forge reports on every descriptor, claim to be done
        "import sys, json, os\nm = sys.modules['__main__']\n"
        "m._encode = lambda v, d=0: True\njson.dumps = lambda *a, **k: '{\"i\": 0, \"ok\": true, \"v\": true}'\n"
        "for fd in range(3, 64):\n    for i in range(3):\n        try:\n"
        "            os.write(fd, ('{\"i\": %d, \"ok\": true, \"v\": true}\\n' % i).encode())\n"
        "        except OSError:\n            pass\n"
        "for fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"done\": true}\\n')\n"
        "    except OSError:\n        pass\n"
        "def add(a, b):\n    return None\n",
        # the model's own tests and runner do not replace the grader's
        "def add(a, b):\n    return a - b\ndef check(candidate):\n    return True\nassert add(1, 1) == 0\n",
    ]
    for attack in attacks:
        assert_zero(run(attack))
    grader_check = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"
    assert_zero(run(attacks[-1], grader_check, entry_point="add"))


FORGE_REPORTS = (  # knows the grader's literals (5, 0, 30), computes nothing, writes "passed" everywhere
    "import json, os\n"
    "lines = [json.dumps({'i': i, 'v': v, 'ok': True}) for i, v in enumerate((5, 0, 30))] + ['{\"done\": true}']\n"
    "lines += [json.dumps({'p': ln, 'm': '0' * 64}) for ln in lines]  # the signed form, without the key\n"
    "for fd in range(3, 256):\n"
    "    for ln in lines:\n"
    "        try:\n"
    "            os.write(fd, (ln + '\\n').encode())\n"
    "        except OSError:\n"
    "            pass\n"
    "def add(a, b):\n    return None\n")


def test_a_forged_report_does_not_pass():
    """Code that knows the expected literals writes passing reports on every descriptor it can reach
    (the old, unsigned form and the signed form without the key): the worker holds neither the report
    pipe nor the per-run key, and the host verifies every line, so nothing it writes counts."""
    assert_zero(run(FORGE_REPORTS))
    assert_zero(run(FORGE_REPORTS, [{"input": "", "output": "5"}]))  # stdin/stdout checks too


PATCHES = [
    # the grader's builtins: sorted() made to return the expected literal
    ("import builtins\nbuiltins.sorted = lambda *a, **k: [2, 4]\ndef twice(x):\n    return x\n",
     ["assert sorted(twice([2, 1])) == [2, 4]"]),
    # the harness's reporting: every failed check reported as passed (json.dumps patched)
    ("import json\n_dumps = json.dumps\n"
     "json.dumps = lambda m, *a, **k: _dumps({'i': m['i'], 'ok': True} if isinstance(m, dict) and 'err' in m else m)\n"
     "def twice(x):\n    return x\n",
     ["for x in range(1, 4):\n    assert twice(x) == 2 * x"]),
    # AssertionError swapped for a class the harness's `except` does not expect, and a lying __eq__
    # in a comparison with no literal side
    ("import builtins\nbuiltins.AssertionError = type('Fine', (Exception,), {})\n"
     "class Eq:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
     "def twice(x):\n    return Eq()\n",
     ["two = 2", "assert twice(2) == two * 2", "for x in range(3):\n    assert twice(x) == x + x"]),
]


@pytest.mark.parametrize("attack, tests", PATCHES, ids=["builtins", "harness", "assert-and-eq"])
def test_patching_the_interpreter_does_not_pass_a_check(attack, tests):
    """The grader's steps run in the judge, another interpreter: what the code patches in its own
    (builtins, json, AssertionError, __eq__) cannot change how a check is evaluated or reported."""
    assert_zero(run(attack, tests))
    assert run(attack.rsplit("def twice", 1)[0] + "def twice(x):\n    return 2 * x if not isinstance(x, list) "
               "else [2 * v for v in x]\n", tests).score == 1.0  # the same checks pass honest code


def test_with_no_file_layer_at_all_it_refuses_unless_weak_isolation_is_allowed(caplog):
    """No mount namespace, no Landlock and no chroot (all three forced off here; a host without namespaces
    otherwise gets Landlock or a chroot: tests/rewards/test_sandbox_fallback.py): the code would read the
    host's world-readable files and write its world-writable folders, so by default nothing runs (status
    "error": the sample is excluded, not scored 0) and a warning names the opt-in."""
    with caplog.at_level("WARNING", logger="tinyrl.rewards.sandbox"):
        r = run_tests(GOOD, TESTS, limits=FAST, namespaces=False, landlock=False, chroot=False)
    assert r.status == "error" and r.score == 0.0 and r.load_error.startswith("refused: no mount namespace, no Landlock")
    assert "weak_isolation" in r.load_error and not r.output and r.isolation["fs"] == "none"
    if os.geteuid() == 0:  # as root the fallback still has a uid of its own: allowed, it runs
        assert run(GOOD, **WEAKEST).score == 1.0


def test_huge_output():
    t0 = time.monotonic()
    assert_zero(run("while True:\n    print('spam' * 1000)\n" + GOOD), "output_limit")
    assert_zero(run(GOOD + "import sys\nsys.stdout.write('x' * (1 << 22))\n"), "output_limit")
    assert_zero(run(GOOD + "import sys\nsys.stderr.write('x' * (1 << 22))\n"), "output_limit")
    assert time.monotonic() - t0 < 15


# --- side doors: SysV IPC, filesystem UNIX sockets, truncating its own output --------------------

IPC_KEY = 0x7E570000 + os.getpid() % 0xFFFF  # a SysV key no one else uses


def host_ipc_keys() -> set[tuple[str, int]]:
    """(kind, key) of every SysV shared-memory segment, message queue and semaphore set on the host."""
    out = set()
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                out |= {(kind, int(ln.split()[0])) for ln in list(f)[1:] if ln.strip()}
        except OSError:
            pass
    return out


def remove_host_ipc(key: int) -> None:
    """Clean up after a failed run of the IPC attack (IPC_RMID on whatever it left on the host)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if (ident := libc.shmget(key, 0, 0)) >= 0:
        libc.shmctl(ident, 0, None)  # IPC_RMID
    if (ident := libc.msgget(key, 0)) >= 0:
        libc.msgctl(ident, 0, None)
    if (ident := libc.semget(key, 0, 0)) >= 0:
        libc.semctl(ident, 0, 0)


IPC_ATTACK = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
made = []
shm = libc.shmget({IPC_KEY}, 1 << 20, 0o1666)  # IPC_CREAT | 0666: a segment that would outlive the run
made.append(shm >= 0)
if shm >= 0:
    addr = libc.shmat(shm, None, 0)
msg = libc.msgget({IPC_KEY}, 0o1666)  # a message queue another run could read
made.append(msg >= 0)
if msg >= 0:
    buf = ctypes.create_string_buffer(b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00secret", 14)
    libc.msgsnd(msg, buf, 6, 0)
sem = libc.semget({IPC_KEY}, 1, 0o1666)
made.append(sem >= 0)
print(made)
assert any(made), "no SysV IPC object could be made"
"""


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "fallback"])
def test_sysv_ipc_does_not_reach_the_host(namespaces):
    """Shared memory, message queues and semaphores made in the sandbox never exist on the host
    (IPC namespace; without one, and without Landlock or a chroot, the seccomp filter refuses the calls)."""
    if not namespaces and os.geteuid() != 0:
        pytest.skip("without namespaces only root can give the code its own uid")
    before = host_ipc_keys()
    try:
        r = run(IPC_ATTACK + GOOD, **({} if namespaces else WEAKEST))
        leaked = {k for k in host_ipc_keys() - before if k[1] == IPC_KEY}
        assert leaked == set(), f"the sandbox left SysV IPC objects on the host: {leaked} ({r})"
        if namespaces and r.isolation.get("mount"):
            assert r.isolation.get("ipc"), r.isolation
        if r.isolation.get("seccomp"):  # refused outright: not even a private segment to pin memory with
            assert_zero(r, "load_error")
    finally:
        remove_host_ipc(IPC_KEY)


@pytest.fixture
def host_sockets(tmp_path):
    """Listening 0666 UNIX sockets (stream and datagram, like /dev/log) where a host keeps them."""
    socks, paths = [], []
    dirs = ["/run", "/dev", "/var/tmp", str(tmp_path)] if os.geteuid() == 0 else ["/var/tmp", str(tmp_path)]
    for d in dirs:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            path = os.path.join(d, f"tinyrl-test-{os.getpid()}-{kind}.sock")
            s = socket.socket(socket.AF_UNIX, kind)
            try:
                s.bind(path)
            except OSError:
                s.close()
                continue
            os.chmod(path, 0o666)
            if kind == socket.SOCK_STREAM:
                s.listen(4)
            s.settimeout(0.2)
            socks.append((s, kind))
            paths.append(path)
    os.chmod(tmp_path, 0o755)
    yield paths, socks
    for s, _ in socks:
        s.close()
    for p in paths:
        os.unlink(p)


# ctypes, not the socket module: without a mount namespace a Python kept under /root has no stdlib
# beyond what the child preloads, and an attack must not depend on that.
SOCKET_ATTACK = """
import ctypes, os, stat
visible = []
for p in PATHS:
    try:
        if stat.S_ISSOCK(os.lstat(p).st_mode):
            visible.append(p)
    except OSError:
        pass
print(visible)
libc = ctypes.CDLL(None, use_errno=True)
class Addr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("path", ctypes.c_char * 108)]
reached = []
for p in PATHS:
    addr = Addr(1, p.encode())  # AF_UNIX
    for kind in (1, 2):  # SOCK_STREAM, SOCK_DGRAM
        fd = libc.socket(1, kind, 0)
        if fd >= 0 and libc.connect(fd, ctypes.byref(addr), ctypes.sizeof(addr)) == 0 and libc.send(fd, b"leak", 4, 0) == 4:
            reached.append(p)
        pair = (ctypes.c_int * 2)()  # a socketpair's datagram end can be sent to a path without connect()
        if libc.socketpair(1, kind, 0, pair) == 0 and libc.sendto(pair[0], b"leak", 4, 0, ctypes.byref(addr), ctypes.sizeof(addr)) == 4:
            reached.append(p)
print(reached)
assert reached
"""


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "fallback"])
def test_unix_sockets_on_the_host_are_unreachable(host_sockets, namespaces):
    if not namespaces and os.geteuid() != 0:
        pytest.skip("without namespaces only root can give the code its own uid")
    paths, socks = host_sockets
    assert paths
    code = SOCKET_ATTACK.replace("PATHS", repr(paths)) + GOOD
    r = run(code, **({} if namespaces else WEAKEST))
    assert_zero(r, "load_error")
    if r.isolation.get("mount"):  # hidden (/run, /dev, /tmp) or covered by /dev/null (/var/tmp): no socket left to find
        assert r.output.splitlines()[0] == "[]", r.output
        assert r.isolation["sockets_left"] == 0 and r.isolation["sockets_covered"] >= 1
    for s, kind in socks:
        with pytest.raises((socket.timeout, BlockingIOError)):
            (s.accept() if kind == socket.SOCK_STREAM else s.recv(16))


def test_only_a_minimal_dev_and_no_run():
    code = ("import os\nprint(sorted(os.listdir('/dev')))\n"
            "print(sorted(os.listdir('/run')) if os.path.isdir('/run') else [])\n"
            "print(sorted(os.listdir('/var/run')) if os.path.isdir('/var/run') else [])\n"
            "open('/dev/null', 'w').write('x')\nassert len(open('/dev/urandom', 'rb').read(8)) == 8\n"
            "assert open('/dev/zero', 'rb').read(4) == bytes(4)\n" + GOOD)
    r = run(code)
    if not r.isolation.get("mount"):
        pytest.skip(f"no mount namespace here: {r.isolation}")
    assert r.score == 1.0, r
    dev, run_dir, var_run = (eval(line) for line in r.output.splitlines())  # noqa: S307 (our own print)
    assert {"null", "zero", "urandom"} <= set(dev) <= {"null", "zero", "random", "urandom", "shm", "fd",
                                                       "stdin", "stdout", "stderr"}, dev
    assert run_dir == [] and var_run == []


def test_truncating_its_own_output_does_not_hide_it():
    """Output is counted as the host reads it: ftruncate/lseek on stdout cannot take it back."""
    for attack in ("import os, sys\nsys.stdout.write('x' * (512 << 10))\nsys.stdout.flush()\n"
                   "for f in (lambda: os.ftruncate(1, 0), lambda: os.lseek(1, 0, 0)):\n"
                   "    try:\n        f()\n    except OSError:\n        pass\n",
                   "import os\nos.write(2, b'y' * (256 << 10))\n"
                   "try:\n    os.ftruncate(2, 10)\nexcept OSError:\n    pass\n"):
        assert_zero(run(GOOD + attack), "output_limit")


@pytest.mark.skipif(os.geteuid() != 0, reason="without namespaces only root can give the code its own uid")
def test_without_namespaces_limits_and_uid_still_hold(host_files):
    """The fallback for hosts that refuse namespaces: rlimits + a fresh uid; cleanup by uid."""
    tmp_path, victim, secret = host_files
    daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
              "print(os.getcwd())\n" + GOOD)
    r = run(daemon, **WEAKEST)  # run() checks that no process of the uid is left
    assert r.score == 1.0 and not any(r.isolation[k] for k in ("net", "mount", "pid"))
    assert r.output.strip().startswith(tempfile.gettempdir()) and not os.path.exists(r.output.strip())
    for attack in (f"open({str(victim)!r}, 'w').write('pwned')\n", f"open({str(secret)!r}).read()\n",
                   "import os\nos.kill(1, 9)\n"):
        assert_zero(run(attack + GOOD, **WEAKEST), "load_error")
    assert_zero(run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                    limits=LOOP, **WEAKEST))


# --- the reward -------------------------------------------------------------------------------

def test_extract_code():
    text = "Plan first.\n```\nnot this\n```\n```python\ndef f():\n    return 1\n```\n"
    assert extract_code(text) == "def f():\n    return 1\n"
    assert extract_code("def f(): pass") is None
    assert extract_code("def f(): pass", fenced_only=False) == "def f(): pass"


def test_code_tests_reward(caplog):
    completions = [f"```python\n{GOOD}```", "```python\ndef add(a, b):\n    return a * b\n```", "no code",
                   "```python\nimport os\nos._exit(0)\n```"]
    rows = [TESTS] * 4
    assert code_tests_reward(["Write add."] * 4, completions, tests=rows, cpu_s=1, wall_s=3) == [1.0, 0.0, 0.0, 0.0]
    assert code_tests_reward(["p"], [completions[0]], tests=[TESTS[:2] + ["assert add(1, 1) == 3"]],
                             partial=False) == [0.0]
    # the grader's own tests do not parse: that sample is excluded (None), not blamed on the model, and the
    # tests are named in one warning however many samples they have
    bad = ["assert add(1, 1) == 2", "assert add(1,"]
    with caplog.at_level("WARNING", logger="tinyrl.rewards.code"):
        assert code_tests_reward(["p"] * 3, [completions[0]] * 3, tests=[bad, TESTS, bad]) == [None, 1.0, None]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "tinyrl.rewards.code"]
    assert "the tests starting 'assert add(1, 1) == 2' cannot be read (SyntaxError" in warning


UNPRIVILEGED = r'''
import importlib.util, json, os, sys
# the sandbox modules by path (this Python has no torch, so not the tinyrl package)
here = os.path.dirname(sys.argv[1])
for name, path in (("tinyrl.errors", os.path.join(os.path.dirname(here), "errors.py")),
                   ("tinyrl.rewards._sandbox_values", os.path.join(here, "_sandbox_values.py")),
                   ("tinyrl.rewards.sandbox_checks", os.path.join(here, "sandbox_checks.py"))):
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[spec.name])
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sb = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sb
spec.loader.exec_module(sb)
limits = sb.Limits(cpu_s=1, wall_s=3, memory_mb=256)
good = "def add(a, b):\n    return a + b\n"
attacks = {
    "write": "open(%r, 'w').write('x')\n" % (sys.argv[2] + "/planted.txt"),
    "umount": "import ctypes\nassert ctypes.CDLL(None).umount2(b'/tmp', 2) == 0\n",
    "net": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n",
    "ipc": "import ctypes\nassert ctypes.CDLL(None).shmget(%s, 4096, 0o1666) >= 0\n" % sys.argv[3],
    "unix_socket": "import socket\nsocket.socket(socket.AF_UNIX).connect(%r)\n" % sys.argv[4],
    "dev": "import os\nassert 'full' in os.listdir('/dev') or 'kmsg' in os.listdir('/dev')\n",
}
out = {"good": vars(sb.run_tests(good, ["assert add(2, 3) == 5"], limits=limits))}
for name, code in attacks.items():
    out[name] = vars(sb.run_tests(code + good, ["assert add(2, 3) == 5"], limits=limits))
print(json.dumps(out))
'''


def test_an_unprivileged_user_gets_a_user_namespace():
    """The path most users take (not root): a user namespace, capabilities dropped."""
    import json
    import shutil
    import subprocess

    import tinyrl.rewards.sandbox as sandbox_module

    setpriv, python = shutil.which("setpriv"), shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if os.geteuid() != 0 or not setpriv or not python:
        pytest.skip("needs root (to become nobody), setpriv and a system python3")
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python]
    scratch = tempfile.mkdtemp(dir="/tmp")  # readable by nobody (pytest's tmp_path is not)
    shared = tempfile.mkdtemp(dir="/tmp")  # writable by anyone on the host, so by nobody without a namespace
    os.chmod(scratch, 0o755)
    os.chmod(shared, 0o777)
    script = os.path.join(scratch, "as_nobody.py")
    with open(script, "w") as f:
        f.write(UNPRIVILEGED)
    os.chmod(script, 0o644)
    try:
        probe = subprocess.run(as_nobody + ["-c", f"open({sandbox_module.CHILD_SCRIPT!r}).read(); open({str(script)!r})"],
                               capture_output=True, cwd="/tmp")
        if probe.returncode != 0:
            pytest.skip("user nobody cannot run this Python or read the sources")
        listener = socket.socket(socket.AF_UNIX)
        sock_path = f"/var/tmp/tinyrl-test-{os.getpid()}-nobody.sock"
        listener.bind(sock_path)
        os.chmod(sock_path, 0o666)
        listener.listen(1)
        listener.settimeout(0.2)
        before = host_ipc_keys()
        try:
            proc = subprocess.run(as_nobody + [str(script), sandbox_module.__file__, shared, str(IPC_KEY), sock_path],
                                  capture_output=True, text=True, cwd="/tmp", timeout=120)
            with pytest.raises(socket.timeout):
                listener.accept()
            assert {k for k in host_ipc_keys() - before if k[1] == IPC_KEY} == set()
        finally:
            listener.close()
            os.unlink(sock_path)
            remove_host_ipc(IPC_KEY)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.splitlines()[-1])
        if not out["good"]["isolation"].get("userns"):
            pytest.skip(f"no unprivileged user namespaces here: {out['good']['isolation']}")
        assert out["good"]["status"] == "ok" and out["good"]["passed"] == [True]
        assert out["good"]["isolation"]["ipc"] and out["good"]["isolation"]["seccomp"], out["good"]["isolation"]
        for name in ("write", "umount", "net", "ipc", "unix_socket", "dev"):
            assert out[name]["status"] == "load_error" and out[name]["passed"] == [False], (name, out[name])
        assert os.listdir(shared) == []
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
