"""The values that cross the sandbox: tagged plain data, rebuilt on the receiving side from its OWN classes.

Loaded by path in the sandbox child (stdlib only, never the tinyrl package) and imported by the host
(`sandbox_checks`). Three interpreters speak it: the worker (the solution's, untrusted), the judge
(the grader's steps) and the host (literal checks).

Why copies: the grader's comparison (`==`, `bool`, `in`) must never call a method the solution
wrote, or an `__eq__` that returns True would pass every check. So a value leaves the worker as
data, chosen by its EXACT type (a subclass, which could override `__eq__`, is not data), and the
judge or the host rebuilds it from the receiver's own classes, whose methods the solution never
touched; the comparison then runs on trusted code. A worker that lies about a value gains nothing it
could not get by returning that value honestly: data carries no behaviour, only content.

What is data (both directions):

- None, bool, int (a huge one in hex), float, str, bytes, bytearray, complex; list, tuple, set, frozenset, dict, range
  (their items again data, or handles);
- `collections.Counter`, `OrderedDict`, `deque` (with its maxlen) and `defaultdict`: equal to a
  dict or list exactly as the real classes are (a Counter equals the dict of its counts). A
  defaultdict keeps its `default_factory` when that is a type listed below (list, int, set, ...);
  any other factory (a lambda) is dropped: the copy then raises KeyError on a missing key;
- `fractions.Fraction`, `decimal.Decimal`;
- a type that a module of TYPE_MODULES names (int, str, collections.Counter, decimal.Decimal, ...),
  e.g. the grader's `remove_datatype(xs, int)` or a solution returning `float`; the receiver looks
  it up in ITS module, so the worker gets its own `int` and the judge the judge's;
- an `re.Match`: a `MatchCopy` (the matched string, pos/endpos and every group's span): true, its
  groups, spans and groupdict as the real one; equal only to itself, as a real Match;
- anything else (a function, a class or an object of the solution, a generator) is a handle
  {"R": [id, type name]}: the judge gets a `Remote` for it (called, its attributes read or set, its
  items read, iterated, its len or str asked, all in the worker), the host nothing (a check on it fails).

Every decoder checks shapes and depth and raises ValueError on anything malformed.
"""

import builtins
import collections
import datetime
import decimal
import fractions
import re

MAX_DEPTH = 50
TYPE_MODULES = {"builtins": builtins, "collections": collections, "fractions": fractions, "decimal": decimal,
                "datetime": datetime, "re": re}
_SEQ = {list: "L", tuple: "T", set: "S", frozenset: "F"}
_SEQ_OF = {v: k for k, v in _SEQ.items()}
_MATCH = type(re.match("", ""))


class MatchCopy:
    """What a solution's `re.Match` is on the judge's and the host's side: always true, its groups and
    spans read from the copied string, equal only to itself (as a real Match)."""

    __slots__ = ("string", "pos", "endpos", "lastindex", "lastgroup", "_spans", "_names")

    def __init__(self, string, pos: int, endpos: int, spans: list, names: dict, lastindex, lastgroup):
        self.string, self.pos, self.endpos = string, pos, endpos
        self.lastindex, self.lastgroup = lastindex, lastgroup
        self._spans, self._names = spans, names

    def _index(self, g) -> int:
        i = self._names.get(g, g) if isinstance(g, str) else g
        if type(i) is not int or not 0 <= i < len(self._spans):
            raise IndexError("no such group")
        return i

    def span(self, group=0) -> tuple:
        return tuple(self._spans[self._index(group)])

    def start(self, group=0) -> int:
        return self.span(group)[0]

    def end(self, group=0) -> int:
        return self.span(group)[1]

    def _group(self, g, default=None):
        s, e = self._spans[self._index(g)]
        return default if s < 0 else self.string[s:e]

    def group(self, *groups):
        if len(groups) <= 1:
            return self._group(groups[0] if groups else 0)
        return tuple(self._group(g) for g in groups)

    def __getitem__(self, g):
        return self._group(g)

    def groups(self, default=None) -> tuple:
        return tuple(self._group(i, default) for i in range(1, len(self._spans)))

    def groupdict(self, default=None) -> dict:
        return {name: self._group(i, default) for name, i in self._names.items()}

    def __repr__(self) -> str:
        return f"<re.Match object; span={self.span()!r}, match={self.group()!r}>"


def type_name(t) -> str | None:
    """"module:qualname" of a type that a module of TYPE_MODULES names (the same object), else None."""
    module = getattr(t, "__module__", None)
    name = getattr(t, "__qualname__", None)
    if type(module) is not str or type(name) is not str or module not in TYPE_MODULES:
        return None
    try:
        return f"{module}:{name}" if find_type(f"{module}:{name}") is t else None
    except ValueError:  # a private or nested name: not a type the other side can look up
        return None


def find_type(spec) -> type:
    """The type "module:qualname" names in this interpreter's TYPE_MODULES; ValueError otherwise."""
    if type(spec) is not str or spec.count(":") != 1:
        raise ValueError("a type is named module:qualname")
    module, name = spec.split(":")
    obj = TYPE_MODULES.get(module)
    for part in name.split("."):
        if obj is None or not part.isidentifier() or part.startswith("_"):
            raise ValueError(f"not a known type: {spec[:80]}")
        obj = getattr(obj, part, None)
    if not isinstance(obj, type):
        raise ValueError(f"not a known type: {spec[:80]}")
    return obj


def encode(v, other=None, depth: int = 0):
    """`v` as tagged plain data, by exact type; anything else through `other(v)` (a handle), or TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(v)
    if t is int and v.bit_length() > 12000:  # past ~3600 digits: JSON's decimal form hits Python's int-string limit
        return {"I": hex(v)}
    if v is None or t in (bool, int, float, str):
        return v
    sub = depth + 1
    if t in _SEQ:
        return {_SEQ[t]: [encode(x, other, sub) for x in v]}
    if t in (dict, collections.Counter, collections.OrderedDict):
        tag = {dict: "D", collections.Counter: "CT", collections.OrderedDict: "OD"}[t]
        return {tag: [[encode(k, other, sub), encode(x, other, sub)] for k, x in v.items()]}
    if t is collections.defaultdict:
        f = v.default_factory
        factory = {"Y": type_name(f)} if isinstance(f, type) and type_name(f) else None
        return {"DD": [factory, [[encode(k, other, sub), encode(x, other, sub)] for k, x in v.items()]]}
    if t is collections.deque:
        return {"DQ": [[encode(x, other, sub) for x in v], v.maxlen]}
    if t in (bytes, bytearray):
        return {"B" if t is bytes else "BA": v.hex()}
    if t is complex:
        return {"C": [v.real, v.imag]}
    if t is range:
        return {"RG": [v.start, v.stop, v.step]}
    if t is fractions.Fraction:
        return {"FR": [v.numerator, v.denominator]}
    if t is decimal.Decimal:
        return {"DE": str(v)}
    if t in (_MATCH, MatchCopy):
        spans = [list(v.span(i)) for i in range(len(v.groups()) + 1)]
        names = dict(v.re.groupindex) if t is _MATCH else dict(v._names)
        return {"M": [encode(v.string, None, sub), v.pos, v.endpos, spans, names, v.lastindex, v.lastgroup]}
    if isinstance(v, type) and type_name(v):
        return {"Y": type_name(v)}
    if other is not None:
        return other(v)
    raise TypeError(f"a {t.__name__} is not plain data")


def _pairs(items, handle, depth) -> list:
    if type(items) is not list or not all(type(p) is list and len(p) == 2 for p in items):
        raise ValueError("malformed mapping")
    return [(decode(k, handle, depth), decode(x, handle, depth)) for k, x in items]


def _int(x) -> int:
    if type(x) is not int:
        raise ValueError("malformed value")
    return x


def _match(items, depth) -> MatchCopy:
    string, pos, endpos, spans, names, lastindex, lastgroup = items
    string = decode(string, None, depth)
    if type(string) not in (str, bytes) or type(spans) is not list or not spans or type(names) is not dict:
        raise ValueError("malformed match")
    spans = [(_int(s), _int(e)) for s, e in spans]
    if any(not (s == e == -1 or 0 <= s <= e <= len(string)) for s, e in spans):
        raise ValueError("malformed match")
    names = {str(k): _int(i) for k, i in names.items()}
    if lastindex is not None:
        _int(lastindex)
    return MatchCopy(string, _int(pos), _int(endpos), spans, names, lastindex,
                     None if lastgroup is None else str(lastgroup))


def decode(v, handle=None, depth: int = 0):
    """The inverse of `encode`, from this interpreter's classes; a handle through `handle(id, name)`
    (None: a handle is an error). ValueError (or TypeError, KeyError) on anything malformed."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) is not dict or len(v) != 1:
        raise ValueError("malformed value")
    (tag, items), = v.items()
    sub = depth + 1
    if tag in _SEQ_OF:
        if type(items) is not list:
            raise ValueError("malformed sequence")
        return _SEQ_OF[tag](decode(x, handle, sub) for x in items)
    if tag in ("D", "CT", "OD"):  # a Counter from a dict: from a list of pairs it would count the pairs
        return {"D": dict, "CT": collections.Counter, "OD": collections.OrderedDict}[tag](dict(_pairs(items, handle, sub)))
    if tag == "DD":
        factory, pairs = items
        factory = None if factory is None else find_type(factory.get("Y") if type(factory) is dict else None)
        return collections.defaultdict(factory, _pairs(pairs, handle, sub))
    if tag == "DQ":
        xs, maxlen = items
        if type(xs) is not list or (maxlen is not None and _int(maxlen) < 0):
            raise ValueError("malformed deque")
        return collections.deque((decode(x, handle, sub) for x in xs), maxlen)
    if tag in ("B", "BA"):
        return (bytes if tag == "B" else bytearray).fromhex(str(items))
    if tag == "C":
        re_, im = items
        return complex(float(re_), float(im))
    if tag == "RG":
        return range(*(_int(x) for x in items))
    if tag == "FR":
        return fractions.Fraction(*(_int(x) for x in items))
    if tag == "DE":
        if type(items) is not str:
            raise ValueError("malformed decimal")
        return decimal.Decimal(items)
    if tag == "M":
        return _match(items, sub)
    if tag == "Y":
        return find_type(items)
    if tag == "I":
        if type(items) is not str or len(items) > 1 << 21:
            raise ValueError("malformed int")
        return int(items, 16)
    if tag == "R":
        if handle is None:
            raise ValueError("an object of the solution is not plain data")
        ref, name = items
        return handle(_int(ref), str(name)[:100])
    raise ValueError(f"unknown tag {str(tag)[:20]!r}")
