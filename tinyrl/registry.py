"""Name -> object registries whose built-in entries are "module:attribute" strings, loaded on first use.

A config names tasks, methods and tools. Checking a name needs only a registry's keys, so
validating a config imports no task, method or tool code, and no module registers anything as
a side effect of being imported: every built-in entry is written out in its registry.

    >>> r = Registry("thing", {"join": "os.path:join"})
    >>> "join" in r, sorted(r)
    (True, ['join'])
    >>> r["join"]("a", "b")
    'a/b'
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import Any


def load_object(spec: str) -> Any:
    """The object a "package.module:attribute" string names (ImportError / AttributeError as raised)."""
    module, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(MutableMapping):
    """A mapping of names to objects; an entry given as "module:attr" is imported when read."""

    def __init__(self, what: str, entries: dict[str, Any]):
        self.what = what  # what a name names, for error messages ("data.task", "method", ...)
        self._entries = dict(entries)

    def register(self, name: str, entry: Any) -> Any:
        """Add (or replace) an entry: an object, or a "module:attr" string to load when used."""
        self._entries[name] = entry
        return entry

    def __getitem__(self, name: str) -> Any:
        if name not in self._entries:
            raise KeyError(f"unknown {self.what} {name!r}; known: {sorted(self._entries)}")
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = load_object(entry)
        return entry

    def __setitem__(self, name: str, entry: Any) -> None:
        self.register(name, entry)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
