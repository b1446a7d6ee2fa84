"""Path safety: every run name that comes from the page becomes a folder inside the runs directory.

A run is named by one path component (letters, digits, `._-`, not starting with a dot); the
resolved folder (symlinks followed) must sit directly inside the resolved runs directory, so
`../x`, `/etc`, `a/b` and a symlink that points outside are all refused.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> resolve_run(root, "tiny-1").name
'tiny-1'
>>> resolve_run(root, "../etc")
Traceback (most recent call last):
...
tinyrl.apps.paths.UnsafePathError: run '../etc': not a run name (letters, digits, '.', '_', '-'; no '/', no leading '.')
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class UnsafePathError(ValueError):
    """A path from the page that would leave the runs directory (or is not a run name)."""


def check_name(name: str, what: str = "run") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:  # fullmatch: `$` allows a final \n
        raise UnsafePathError(f"{what} {name!r}: not a run name (letters, digits, '.', '_', '-'; "
                              f"no '/', no leading '.')")
    return name


def resolve_run(runs_dir: Path, name: str) -> Path:
    """`runs_dir / name`, refused unless it resolves (symlinks followed) directly inside `runs_dir`."""
    check_name(name)
    root = Path(runs_dir).resolve()
    path = (root / name).resolve()
    if path.parent != root:
        raise UnsafePathError(f"run {name!r}: resolves to {path}, outside the runs directory {root}")
    return path


def inside(path: Path, root: Path) -> bool:
    """True when `path` (symlinks followed) is `root` or below it."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except ValueError:
        return False
