"""The sandbox on a host without namespaces (issue 49): Colab, Kaggle, RunPod, vast.ai containers run with Docker's
default seccomp profile and no CAP_SYS_ADMIN, so unshare() is refused there. The sandbox then keeps the code off
the host's files with Landlock (the default where the kernel has it), or as root with a chroot into an empty
directory; the same attacks score 0 and leave the host untouched.

Two ways to take the namespaces away: `run_tests(namespaces=False)` (and `landlock=False` for the chroot), in
this process; and for real, a subprocess that cannot make namespaces at all: a seccomp filter refusing
unshare/setns/clone with namespace flags (as Docker's default profile does) and, as root, Docker's default
capability set (no CAP_SYS_ADMIN), or as user nobody.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from tinyrl.rewards import _sandbox_landlock
from tinyrl.rewards.sandbox import Limits, run_tests

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox uses Linux rlimits and Landlock")

FAST = Limits(cpu_s=1, wall_s=3, memory_mb=256, nproc=4)
LOOP = Limits(cpu_s=1, wall_s=1.2, memory_mb=256, nproc=4)
TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]
GOOD = "def add(a, b):\n    return a + b\n"
ABI = _sandbox_landlock.abi()
ROOT = os.geteuid() == 0
MODES = {"landlock": {"namespaces": False}, "chroot": {"namespaces": False, "landlock": False}}


def uid_processes(uid: int) -> list[int]:
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/status") as f:
                if any(ln.startswith("Uid:") and int(ln.split()[1]) == uid for ln in f):
                    pids.append(int(p))
        except OSError:
            pass
    return pids


@pytest.fixture(params=list(MODES))
def mode(request):
    if request.param == "landlock" and not ABI:
        pytest.skip("no Landlock on this kernel")
    if request.param == "chroot" and not ROOT:
        pytest.skip("the chroot fallback needs root")
    return request.param


def run(mode, code, tests=TESTS, limits=FAST):
    r = run_tests(code, tests, limits=limits, **MODES[mode])
    if r.status != "output_limit":  # (a flood can end the run before its "ready" line is read)
        assert r.isolation["fs"] == mode and not r.isolation["mount"], r.isolation
    if ROOT and r.isolation:  # nothing of the sandbox's uid survives the run
        assert uid_processes(r.isolation["uid"]) == []
    return r


def test_without_namespaces_the_strongest_file_layer_is_the_default():
    r = run_tests(GOOD, TESTS, limits=FAST, namespaces=False)
    want = "landlock" if ABI else "chroot" if ROOT else "none"
    assert r.isolation["fs"] == want, r.isolation
    if want == "none":  # not root, no Landlock: refused unless weak isolation is allowed
        assert r.status == "error" and r.load_error.startswith("refused")
    else:
        assert r.status == "ok" and r.passed == [True, True], r
    if want == "landlock":
        assert r.isolation["landlock"] == ABI and r.isolation["landlock_rules"] > 4 and r.isolation["seccomp"]


def test_correct_code_passes_and_may_use_its_own_directory(mode):
    code = ("import os, tempfile, json, collections\n"
            "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n"
            "with tempfile.NamedTemporaryFile('w') as f:\n    f.write('x')\n"
            "print(os.getcwd())\n" + GOOD)
    r = run(mode, code)
    assert r.status == "ok" and r.passed == [True, True], r
    where = r.output.strip()
    assert where == "/" if mode == "chroot" else where.startswith(tempfile.gettempdir())
    assert mode == "chroot" or not os.path.exists(where)  # removed after the run


@pytest.fixture
def host():
    """A victim file and a world-readable secret in a world-writable folder anyone can reach (under /tmp, not
    pytest's private one: the sandbox's uid must be stopped by the sandbox, not by the folder's mode), and 0666
    UNIX sockets listening where a host keeps them."""
    folder = tempfile.mkdtemp(dir="/tmp", prefix="tinyrl-host-")
    os.chmod(folder, 0o777)
    victim, secret = os.path.join(folder, "victim.txt"), os.path.join(folder, "secret.txt")
    for path, text in ((victim, "original"), (secret, "the hidden answer is 1234")):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o666 if path == victim else 0o644)
    socks = []
    for d in (["/run"] if ROOT else []) + ["/var/tmp", folder]:
        path = os.path.join(d, f"tinyrl-fallback-{os.getpid()}.sock")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(path)
        except OSError:
            s.close()
            continue
        os.chmod(path, 0o666)
        s.listen(2)
        s.settimeout(0.1)
        socks.append((s, path))
    before = sorted(os.listdir(folder))
    try:
        yield {"dir": folder, "victim": victim, "secret": secret, "socks": [p for _, p in socks], "cwd": os.getcwd(),
               "pid": os.getpid()}
        for s, _ in socks:
            with pytest.raises((socket.timeout, BlockingIOError)):
                s.accept()  # nothing ever connected
        with open(victim) as f:
            assert f.read() == "original"
        assert sorted(os.listdir(folder)) == before
        for junk in ("/tmp", "/var/tmp", "/dev/shm", os.getcwd()):
            assert not os.path.exists(os.path.join(junk, "tinyrl-sandbox-was-here"))
    finally:
        for s, path in socks:
            s.close()
            os.unlink(path)
        shutil.rmtree(folder, ignore_errors=True)


# ctypes, not the socket module: the supervisor has imported ctypes, but a uid of its own may not be able to
# read a Python kept under /root, and an attack must not fail only for want of a module
CONNECT = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class Addr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("path", ctypes.c_char * 108)]
reached = []
for p in {socks!r}:
    fd = libc.socket(1, 1, 0)
    addr = Addr(1, p.encode())
    if fd >= 0 and libc.connect(fd, ctypes.byref(addr), ctypes.sizeof(addr)) == 0:
        reached.append(p)
assert reached, "no socket"
"""
ATTACKS = {
    "write a host file": "open({victim!r}, 'w').write('pwned')\n",
    "delete a host file": "import os\nos.remove({victim!r})\n",
    "create in a world-writable folder": "open({dir!r} + '/new.txt', 'w').write('x')\n",
    "write /tmp": "open('/tmp/tinyrl-sandbox-was-here', 'w').write('x')\n",
    "write /var/tmp": "open('/var/tmp/tinyrl-sandbox-was-here', 'w').write('x')\n",
    "write /dev/shm": "open('/dev/shm/tinyrl-sandbox-was-here', 'w').write('x')\n",
    "write the host's working directory": "open({cwd!r} + '/tinyrl-sandbox-was-here', 'w').write('x')\n",
    "read a world-readable secret": "print(open({secret!r}).read())\n",
    "read it through a symlink": "import os\nos.symlink({secret!r}, 'l')\nprint(open('l').read())\n",
    "read it through a hard link": "import os\nos.link({secret!r}, 'h')\nprint(open('h').read())\n",
    "move its file out": "open('x', 'w').write('x')\nimport os\nos.rename('x', {dir!r} + '/moved')\n",
    "list the host's working directory": "import os\nprint(os.listdir({cwd!r}))\n",
    "read /proc of the host": "print(open('/proc/{pid}/cmdline').read())\n",
    "signal a host process": "import os\nos.kill({pid}, 0)\n",
    "ptrace a host process": "import ctypes\nassert ctypes.CDLL(None).ptrace(16, {pid}, 0, 0) == 0\n",
    "escape the chroot": "import os\nos.mkdir('d')\nos.chroot('d')\nos.chdir('../../../..')\nprint(os.listdir('.'))\n",
    "open a socket": "import ctypes\nassert ctypes.CDLL(None).socket(2, 1, 0) >= 0\n",
    "connect to the host's UNIX sockets": CONNECT,
    "SysV shared memory": "import ctypes\nassert ctypes.CDLL(None).shmget(0x7E571234, 4096, 0o1666) >= 0\n",
    "truncate a file by path": "import os\nos.truncate({victim!r}, 0)\n",
    "sys.exit before the tests": "import sys\nsys.exit(0)\n",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_attack_scores_zero_and_leaves_the_host_untouched(mode, host, attack):
    code = ATTACKS[attack].format(**host)
    r = run(mode, code + GOOD)
    assert r.score == 0.0 and r.status == "load_error", (attack, r)
    assert "1234" not in r.output


def test_runaway_processes_and_memory_are_bounded_and_cleaned_up(mode):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert run(mode, bomb + GOOD, limits=LOOP).score == 0.0
    daemon = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
              "def add(a, b):\n    return a - b\n")
    assert run(mode, daemon).score == 0.0  # run() checks that no process of the uid is left
    assert run(mode, "x = bytearray(1 << 36)\n" + GOOD).score == 0.0
    assert run(mode, "while True:\n    pass\n" + GOOD, limits=LOOP).score == 0.0
    assert run(mode, "while True:\n    print('spam' * 1000)\n" + GOOD).status == "output_limit"


def test_the_judge_is_still_out_of_reach(mode):
    """Forged reports on every descriptor, a lying __eq__, a patched AssertionError: the judge and the key are
    apart from the code whatever the file layer."""
    forge = ("import os\nfor fd in range(3, 256):\n    try:\n        os.write(fd, b'{\"i\": 0, \"ok\": true}\\n{\"done\": true}\\n')\n"
             "    except OSError:\n        pass\n"
             "import builtins\nbuiltins.AssertionError = type('Fine', (Exception,), {})\n"
             "class Eq:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Eq()\n")
    assert run(mode, forge).passed == [False, False]


# --------------------------------------------------------------------------- for real: no namespace can be made

NO_NAMESPACES = r'''
import ctypes, importlib.util, json, os, platform, sys
nr = {"x86_64": (0xC000003E, 272, 308, 56), "aarch64": (0xC00000B7, 97, 268, 220)}[platform.machine()]
arch, unshare, setns, clone = nr
if sys.argv[3] == "docker":  # Docker's default profile without CAP_SYS_ADMIN: unshare, setns, namespace clones refused
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, 0x7FFF0000), (0x20, 0, 0, 0),
            (0x15, 6, 0, unshare), (0x15, 5, 0, setns), (0x15, 5, 0, 435), (0x15, 0, 2, clone),
            (0x20, 0, 0, 16), (0x45, 1, 0, 0x7E020000), (0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050001),
            (0x06, 0, 0, 0x00050026)]
else:  # user namespaces allowed, but no mount namespace (unshare with CLONE_NEWNS refused)
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, 0x7FFF0000), (0x20, 0, 0, 0), (0x15, 0, 2, unshare),
            (0x20, 0, 0, 16), (0x45, 1, 0, 0x00020000), (0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050001)]
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
libc = ctypes.CDLL(None, use_errno=True)
arr = (Insn * len(prog))(*[Insn(*i) for i in prog])
assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs
assert libc.prctl(22, 2, ctypes.byref(Prog(len(prog), arr)), 0, 0) == 0
assert libc.unshare(0x00020000) != 0  # no mount namespace

here = os.path.dirname(sys.argv[1])  # the sandbox modules by path (this Python has no torch: not the package)
for name, path in (("tinyrl.errors", os.path.join(os.path.dirname(here), "errors.py")),
                   ("tinyrl.rewards._sandbox_values", os.path.join(here, "_sandbox_values.py")),
                   ("tinyrl.rewards.sandbox_checks", os.path.join(here, "sandbox_checks.py")),
                   ("sandbox", sys.argv[1])):
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
sb = sys.modules["sandbox"]
host = json.loads(sys.argv[2])
limits = sb.Limits(cpu_s=1, wall_s=3, memory_mb=256)
good = "def add(a, b):\n    return a + b\n"
out = {"good": vars(sb.run_tests(good, ["assert add(2, 3) == 5"], limits=limits))}
for name, code in host["attacks"].items():
    out[name] = vars(sb.run_tests(code + good, ["assert add(2, 3) == 5"], limits=limits))
# a daemonised grandchild (room for it under RLIMIT_NPROC): it prints its pid, which must be gone after the run
daemon = ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
          "        print(os.getpid(), flush=True)\n        time.sleep(60)\n    os._exit(0)\ntime.sleep(0.3)\n")
r = sb.run_tests(daemon + good, ["assert add(2, 3) == 5"], limits=sb.Limits(cpu_s=1, wall_s=3, nproc=64))
pids = [int(x) for x in r.output.split()]
out["daemon"] = {"status": r.status, "pids": pids, "left": [p for p in pids if os.path.exists(f"/proc/{p}")]}
print(json.dumps(out))
'''
DOCKER_CAPS = ("chown,dac_override,fsetid,fowner,mknod,net_raw,setgid,setuid,setfcap,setpcap,net_bind_service,"
               "sys_chroot,kill,audit_write")  # Docker's default capability set: no sys_admin


@pytest.mark.parametrize("who, profile", [("root-docker-caps", "docker"), ("nobody", "docker"), ("nobody", "userns-only")])
def test_for_real_on_a_host_that_refuses_namespaces(who, profile):
    """Docker's profile: no namespace at all (as root with Docker's capabilities, and as nobody). userns-only:
    a user namespace and the network, PID and IPC namespaces inside it, but no mount namespace."""
    setpriv, python = shutil.which("setpriv"), shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if not ROOT or not setpriv or not python:
        pytest.skip("needs root (to drop CAP_SYS_ADMIN or become nobody), setpriv and a system python3")
    if not ABI:
        pytest.skip("no Landlock on this kernel: the for-real path would be the chroot (root) or a refusal")
    prefix = ([setpriv, f"--bounding-set=-all,+{DOCKER_CAPS.replace(',', ',+')}", python] if who.startswith("root")
              else [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python])
    scratch = tempfile.mkdtemp(dir="/tmp")  # readable by nobody (pytest's tmp_path may not be)
    shared = tempfile.mkdtemp(dir="/tmp")  # world-writable, as /tmp is
    os.chmod(scratch, 0o755)
    os.chmod(shared, 0o777)
    secret = os.path.join(scratch, "secret.txt")
    with open(secret, "w") as f:
        f.write("the hidden answer is 1234")
    os.chmod(secret, 0o644)
    script = os.path.join(scratch, "no_namespaces.py")
    with open(script, "w") as f:
        f.write(NO_NAMESPACES)
    os.chmod(script, 0o644)
    listener = socket.socket(socket.AF_UNIX)
    sock_path = f"/var/tmp/tinyrl-fallback-{os.getpid()}.sock"
    listener.bind(sock_path)
    os.chmod(sock_path, 0o666)
    listener.listen(1)
    listener.settimeout(0.1)
    sleeper = subprocess.Popen(prefix[:-1] + ["sleep", "60"])  # a process of the same user, outside the sandbox
    import tinyrl.rewards.sandbox as sandbox_module

    attacks = {"write": f"open({shared!r} + '/planted.txt', 'w').write('x')\n",
               "read": f"print(open({secret!r}).read())\n",
               "net": "import ctypes\nassert ctypes.CDLL(None).socket(2, 1, 0) >= 0\n",
               "unix_socket": CONNECT.format(socks=[sock_path]),
               "ipc": "import ctypes\nassert ctypes.CDLL(None).shmget(0x7E575678, 4096, 0o1666) >= 0\n",
               "proc": f"print(open('/proc/{sleeper.pid}/cmdline').read())\n",
               "dev": "import os\nprint(os.listdir('/dev'))\n",
               "signal": f"import os\nos.kill({sleeper.pid}, 0)\n",
               "home": "import os\nprint(os.listdir(os.path.expanduser('~')))\n"}
    try:
        proc = subprocess.run(prefix + [script, sandbox_module.__file__, json.dumps({"attacks": attacks}), profile],
                              capture_output=True, text=True, cwd="/tmp", timeout=180)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
        os.unlink(sock_path)
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.splitlines()[-1])
        iso = out["good"]["isolation"]
        assert out["good"]["status"] == "ok" and out["good"]["passed"] == [True], out["good"]
        namespaces = {"net", "pid", "ipc", "userns"} if profile == "userns-only" else set()
        assert iso["fs"] == "landlock" and not iso["mount"], iso
        assert {k for k in ("net", "pid", "ipc", "userns") if iso[k]} == namespaces, iso
        assert iso["seccomp"] and iso["root"] == who.startswith("root")
        stoppable = set(attacks) - ({"signal"} if ABI < 6 and not namespaces and who == "nobody" else set())
        for name in stoppable:
            assert out[name]["status"] == "load_error" and out[name]["passed"] == [False], (name, out[name])
            assert "1234" not in out[name]["output"]
        assert os.listdir(shared) == []
        daemon = out["daemon"]  # not root, no PID namespace: killed as a descendant of the supervisor, never by uid
        assert daemon["status"] == "ok" and len(daemon["pids"]) == 1, daemon
        assert iso["pid"] or daemon["left"] == [], daemon
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_landlock_rules_cut_hidden_paths_out_of_the_readable_ones(tmp_path):
    for d in ("a/keep", "a/hide/x", "b"):
        (tmp_path / d).mkdir(parents=True)
    got = _sandbox_landlock._readable([str(tmp_path / "a"), str(tmp_path / "b")], [str(tmp_path / "a" / "hide")])
    assert sorted(got) == [str(tmp_path / "a" / "keep"), str(tmp_path / "b")]
