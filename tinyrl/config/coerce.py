"""Typed building of config dataclasses from YAML-shaped dicts, field by field.

`build(cls, data, path)` turns a mapping into `cls`, coercing every value to its annotated type
and calling the section's `validate(path)`, so every wrong key or value fails with the dotted
path of the field and what it accepts. `check` is the one-line assertion the sections use.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union

from tinyrl.errors import ConfigError


def check(ok: bool, path: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {msg}")


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
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise bad
        return value
    raise TypeError(f"config field type {tp!r} at {path} is not supported")


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
    return obj

