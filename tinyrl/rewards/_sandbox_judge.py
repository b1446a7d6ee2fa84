"""The judge of the sandbox child: the grader's checks, evaluated outside the code's interpreter.

Loaded by path from `_sandbox_child.py` (stdlib only, never the tinyrl package). The supervisor
forks two processes: the worker, which runs the model's code and nothing else, and this judge,
which runs the grader's steps. The judge drops its privileges like the worker (as root, to a uid of
its own), is not dumpable (the worker can neither ptrace it nor open its /proc/<pid>/mem or fd),
and alone holds the report pipe and the per-run key that signs every report line; the worker never
has either (it is forked before the supervisor reads the key, and closes the report pipe first).

In the judge's namespace the names the solution defines are proxies (`Remote`): calling one sends
its arguments to the worker as plain data (exact builtin types), the worker calls the solution and
answers with plain data, or with a handle for any other object (which can be called or asked for an
attribute, and is equal to nothing, true or false to nothing). Builtins, AssertionError, the
comparisons and the report are the judge's own: all the code controls is what its functions return.
A name the solution defines that is also a builtin stays the builtin (unless it is the entry point).
Arguments are copies: a check of an in-place change to an argument cannot see it.
"""

import builtins
import hashlib
import hmac
import json
import os


class Gone(BaseException):
    """The worker ended or broke the protocol: judging stops (the run did not end normally)."""


class SolutionError(Exception):
    """An exception of a type the judge does not have, raised by the solution."""


def encode(v, depth: int = 0):
    """Plain data only, by exact type (a subclass with a lying __eq__ does not pass); a `Remote` by its handle."""
    if depth > 50:
        raise ValueError("value nested too deeply")
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if t in (list, tuple, set, frozenset):
        return {{list: "L", tuple: "T", set: "S", frozenset: "F"}[t]: [encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"D": [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]}
    if t is bytes:
        return {"B": v.hex()}
    if t is complex:
        return {"C": [v.real, v.imag]}
    if t is Remote:
        return {"R": v._id}
    raise TypeError(f"a {t.__name__} is not plain data")


def decode(v, handles: dict | None = None):
    """The inverse of `encode`; a handle {"R": id} becomes the worker's object (worker side only)."""
    if isinstance(v, dict):
        (tag, items), = v.items()
        if tag == "R":
            if handles is None or items not in handles:
                raise ValueError("not a handle of this worker")
            return handles[items]
        if tag == "D":
            return {decode(k, handles): decode(x, handles) for k, x in items}
        if tag == "B":
            return bytes.fromhex(items)
        if tag == "C":
            return complex(*items)
        return {"L": list, "T": tuple, "S": set, "F": frozenset}[tag](decode(x, handles) for x in items)
    return v


class Channel:
    """Newline-framed JSON over two pipe ends; a reply longer than `limit` bytes is a broken protocol."""

    def __init__(self, rfd: int, wfd: int, limit: int):
        self.rfd, self.wfd, self.limit, self.buf = rfd, wfd, limit, b""

    def send(self, msg) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except OSError as e:
            raise Gone(f"the other side is gone ({e})") from None

    def recv(self):
        while b"\n" not in self.buf:
            if len(self.buf) > self.limit:
                raise Gone("a reply over the value limit")
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                raise Gone("the solution's process ended")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise Gone("a reply that is not JSON") from None


class Remote:
    """An object of the solution, held in the worker: call it, or read an attribute (plain data or a Remote)."""

    __slots__ = ("_judge", "_id", "_name")

    def __init__(self, judge: "Judge", ref: int, name: str):
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_id", ref)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        return self._judge.ask({"call": self._id, "args": encode(list(args)), "kwargs": encode(dict(kwargs))})

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._judge.ask({"getattr": self._id, "name": attr})

    def __bool__(self) -> bool:
        raise TypeError(f"{self._name} (an object of the solution) is not plain data")

    def __repr__(self) -> str:
        return f"<solution object {self._name}>"


class Judge:
    def __init__(self, channel: Channel):
        self.ch = channel

    def answer(self, reply):
        """A worker's reply as a value, a Remote, or the exception it stands for."""
        if not isinstance(reply, dict):
            raise Gone("a malformed reply")
        if "v" in reply:
            return decode(reply["v"])
        if "h" in reply:
            return Remote(self, int(reply["h"]), str(reply.get("name", "object"))[:100])
        if "raise" in reply:
            name, text = (str(x)[:300] for x in reply["raise"])
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception):  # the grader may expect a ValueError
                raise cls(text)
            raise SolutionError(f"{name}: {text}")
        raise Gone("a malformed reply")

    def ask(self, request):
        self.ch.send(request)
        return self.answer(self.ch.recv())


def run(job: dict, channel: Channel, say, iso: dict) -> None:
    """Read the worker's "ready" (written before any untrusted code ran) and its load, then judge each step."""
    judge = Judge(channel)
    try:
        ready = channel.recv()
        if not isinstance(ready, dict) or "ready" not in ready:
            raise Gone("no ready line from the worker")
        iso.update({k: v for k, v in ready["ready"].items() if k in ("seccomp", "seccomp_error")})
        if "fatal" in ready:
            say({"ready": iso, "fatal": str(ready["fatal"])[:300]})
            return
        say({"ready": iso})
        loaded = channel.recv()
    except Gone:
        return
    if not isinstance(loaded, dict) or ("loaded" not in loaded and "load_error" not in loaded):
        return
    if "load_error" in loaded:
        say({"load_error": str(loaded["load_error"])[:300]})
        return
    ns = {"__name__": "__main__", "__builtins__": builtins}
    try:
        for name, reply in dict(loaded["loaded"]).items():
            if isinstance(name, str) and (not hasattr(builtins, name) or name == job.get("entry_point")):
                ns[name] = judge.answer(reply)
    except (Gone, ValueError, TypeError):
        return
    for step in job["steps"]:
        i = step.get("i")
        try:
            if step["kind"] in ("eval", "io"):
                value = eval(step["src"], ns) if step["kind"] == "eval" else judge.ask({"io": step["src"]})  # noqa: S307
                line = {"i": i, "v": encode(value)}
                if len(json.dumps(line)) > job["limits"]["value_bytes"]:
                    raise ValueError("value too large")
                say(line)
            else:
                exec(step["src"], ns)  # noqa: S102 (the grader's own statement)
                if i is not None:
                    say({"i": i, "ok": True})
        except Gone:
            return  # no "done": the run did not end normally
        except BaseException as e:  # noqa: BLE001
            if i is not None:
                say({"i": i, "err": f"{type(e).__name__}: {e}"[:200]})
    say({"done": True})


def signer(key: bytes, fd: int):
    """say(msg): one report line, {"p": payload, "m": HMAC-SHA256(key, payload)}; the host drops any other."""

    def say(msg) -> None:
        payload = json.dumps(msg)
        mac = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
        try:
            os.write(fd, (json.dumps({"p": payload, "m": mac}) + "\n").encode())
        except OSError:  # the host stopped reading (it has what it needs)
            pass

    return say
