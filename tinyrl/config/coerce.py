"""Typed building of config dataclasses from YAML-shaped dicts, field by field.

`build(cls, data, path)` turns a mapping into `cls`, coercing every value to its annotated type
and calling the section's `validate(path)`, so every wrong key or value fails with the dotted
path of the field and what it accepts. `check` is the one-line assertion the sections use.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from tinyrl.errors import ConfigError


def check(ok: bool, path: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {msg}")


def check_local(value: str, path: str, what: str = "file or folder", hint: str = "") -> None:
    """ConfigError naming `path` unless `value` is an existing regular file or folder: a FIFO, a device or a
    socket (`/dev/zero`, a named pipe) would be read forever, so it is refused before anything opens it."""
    p = Path(value).expanduser()
    if not p.exists():
        raise ConfigError(f"{path}: {what} not found: {value}{hint}")
    if not (p.is_file() or p.is_dir()):
        raise ConfigError(f"{path}: {value} is not a regular file or folder (a pipe, a device or a socket)")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping with keys {[f.name for f in dataclasses.fields(tp)]}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Turn a YAML value into `tp`, or raise ConfigError naming `path` and what is allowed."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise bad
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError:
                continue
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        if len(value) > MAX_LIST:
            raise ConfigError(f"{path}: a list of at most {MAX_LIST} items, got {len(value)}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        shorthand = getattr(tp, "SHORTHAND", None)  # a bare string names this field (RewardSpec: its name)
        if isinstance(value, str) and shorthand:
            value = {shorthand: value}
        if not isinstance(value, dict):
            raise bad
        return build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if not isinstance(value, str):
            raise bad
        if len(value) > MAX_STR or "\x00" in value:
            raise ConfigError(f"{path}: a string of at most {MAX_STR} characters and no NUL character, got "
                              f"{len(value)} characters{' with a NUL' if chr(0) in value else ''}")
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise bad
        if len(value) > MAX_LIST:
            raise ConfigError(f"{path}: a mapping of at most {MAX_LIST} keys, got {len(value)}")
        return value
    raise TypeError(f"config field type {tp!r} at {path} is not supported")


# Every number a user sets is bounded: a section's LIMITS = {field: (low, high)} gives its own range (the sizes
# that allocate or loop: tokens, samples, groups, steps), and every other number falls in DEFAULT_LIMITS. A float
# must also be finite. Strings are bounded in length and hold no NUL; lists in length.
DEFAULT_LIMITS = {int: (-(10**9), 10**9), float: (-1e12, 1e12)}
MAX_STR, MAX_LIST = 100_000, 10_000


def _num(x) -> str:
    """A bound or value as a user wrote it: whole numbers in full, floats short."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _check_limits(cls: type, obj: Any, path: str) -> None:
    limits = getattr(cls, "LIMITS", {})
    for f in dataclasses.fields(cls):
        v, where = getattr(obj, f.name), f"{path}.{f.name}" if path else f.name
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            lo, hi = limits.get(f.name, DEFAULT_LIMITS[float if isinstance(v, float) else int])
            check(isinstance(v, int) or math.isfinite(v), where, f"must be a finite number, got {v}")
            check(lo <= v <= hi, where, f"must be in [{_num(lo)}, {_num(hi)}], got {_num(v)}")
        elif f.name in limits and v is not None and not isinstance(v, (int, float)):
            raise TypeError(f"{cls.__name__}.LIMITS names {f.name!r}, which is not a number")


def build(cls: type, data: dict, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown field{hint}; allowed: {names}")
        kwargs[key] = _coerce(value, hints[key], where)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path}.{missing[0]}: required field is missing")
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        obj.validate(path)
    _check_limits(cls, obj, path)
    return obj

