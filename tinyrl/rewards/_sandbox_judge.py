"""The judge of the sandbox child: the grader's checks, evaluated outside the code's interpreter.

Loaded by path from `_sandbox_child.py` (stdlib only, never the tinyrl package). The supervisor
forks two processes: the worker, which runs the model's code and nothing else, and this judge,
which runs the grader's steps. The judge drops its privileges like the worker (as root, to a uid of
its own), is not dumpable (the worker can neither ptrace it nor open its /proc/<pid>/mem or fd),
and alone holds the report pipe and the per-run key that signs every report line; the worker never
has either (it is forked before the supervisor reads the key, and closes the report pipe first).

In the judge's namespace the names the solution defines are proxies (`Remote`): calling one sends
its arguments to the worker as data (`_sandbox_values`: exact types, rebuilt by the receiver from
its own classes), the worker calls the solution and answers with data, or with a handle for any
other object. A handle (a `Remote`) can be called, its attributes read or set (`root.left =
Node(2)`: a tree the grader builds from the solution's class), its items read, iterated, its
`len` and `str` asked: each is a value the worker computes, which the judge then compares with its
own code. It is never asked a verdict: it is equal to nothing but itself, true or false to
nothing, and `x in handle` compares the judge's `x` with the items it iterates. Builtins,
AssertionError, the comparisons and the report are the judge's own: all the code controls is what
its functions return, and data carries no methods.
A name the solution defines that is also a builtin stays the builtin (unless it is the entry point).
Arguments are copies: a check of an in-place change to an argument cannot see it (except on a
handle, which is the worker's object itself).
"""

import builtins
import hashlib
import hmac
import json
import os

try:  # in the sandbox child: loaded by path beside this file (and registered under this name)
    import _sandbox_values as values
except ImportError:  # imported as part of the package (the doctests)
    from tinyrl.rewards import _sandbox_values as values


class Gone(BaseException):
    """The worker ended or broke the protocol: judging stops (the run did not end normally)."""


class SolutionError(Exception):
    """An exception of a type the judge does not have, raised by the solution."""


def encode(v):
    """Data for the worker (or the host): a `Remote` as its handle; anything else not data is a TypeError."""
    return values.encode(v, _handle_of)


def _handle_of(v):
    if type(v) is Remote:
        return {"R": [v._sbx_id, v._sbx_name]}
    raise TypeError(f"a {type(v).__name__} is not plain data")


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
    """An object of the solution, held in the worker. Each operation is a value the worker computes
    (a call, an attribute, an item, its items, len, str); none is a verdict (no ==, <, bool, in)."""

    __slots__ = ("_sbx_judge", "_sbx_id", "_sbx_name")  # names no solution attribute is likely to have

    def __init__(self, judge: "Judge", ref: int, name: str):
        object.__setattr__(self, "_sbx_judge", judge)
        object.__setattr__(self, "_sbx_id", ref)
        object.__setattr__(self, "_sbx_name", name)

    def __call__(self, *args, **kwargs):
        return self._sbx_judge.ask({"call": self._sbx_id, "args": encode(list(args)), "kwargs": encode(dict(kwargs))})

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._sbx_judge.ask({"getattr": self._sbx_id, "name": attr})

    def __setattr__(self, attr: str, value) -> None:
        if attr.startswith("__"):
            raise AttributeError(f"cannot set {attr} on {self._sbx_name} (an object of the solution)")
        self._sbx_judge.ask({"setattr": self._sbx_id, "name": attr, "value": encode(value)})

    def __getitem__(self, key):
        return self._sbx_judge.ask({"getitem": self._sbx_id, "key": encode(key)})

    def __iter__(self):
        items = self._sbx_judge.ask({"iter": self._sbx_id})
        if type(items) is not list:
            raise TypeError(f"{self._sbx_name} (an object of the solution) did not iterate to a list")
        return iter(items)

    def __len__(self) -> int:
        n = self._sbx_judge.ask({"len": self._sbx_id})
        if type(n) is not int:
            raise TypeError(f"len of {self._sbx_name} is not an int")
        return n

    def __str__(self) -> str:
        text = self._sbx_judge.ask({"str": self._sbx_id})
        if type(text) is not str:
            raise TypeError(f"str of {self._sbx_name} is not a str")
        return text

    def __bool__(self) -> bool:
        raise TypeError(f"{self._sbx_name} (an object of the solution) is not plain data: it is neither true nor false")

    def __repr__(self) -> str:
        return f"<solution object {self._sbx_name}>"


class Judge:
    def __init__(self, channel: Channel):
        self.ch = channel

    def answer(self, reply):
        """A worker's reply as a value, a Remote, or the exception it stands for."""
        if not isinstance(reply, dict):
            raise Gone("a malformed reply")
        if "v" in reply:
            try:
                return values.decode(reply["v"], lambda ref, name: Remote(self, ref, name))
            except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError) as e:
                raise Gone(f"a malformed value ({type(e).__name__})") from None
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
        iso.update({k: v for k, v in ready["ready"].items() if k in ("seccomp", "seccomp_error", "landlock_rules")})
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
