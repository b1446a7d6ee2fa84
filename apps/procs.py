"""Processes the UI started, recorded in pid files so any later UI process can find them again.

A pid file is JSON: pid, host, the kernel's start time of that pid (so a recycled pid is not
mistaken for the run), the command and when it started. The trainer's own `<run>/.lock`
(pid + host) is read the same way, for runs started outside the UI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from tinyrl.runs import atomic_write_text


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None (no such pid, or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """The pid's start time in clock ticks since boot (Linux), None where unknown."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def write_pidfile(path: Path, pid: int, cmd: list[str], kind: str) -> dict:
    info = {"pid": pid, "host": socket.gethostname(), "start_ticks": start_ticks(pid), "cmd": cmd,
            "kind": kind, "started_at": time.time()}
    atomic_write_text(Path(path), json.dumps(info))
    return info


def read_pidfile(path: Path) -> dict | None:
    """A pid file (or a trainer lock: JSON, or text such as `pid host` / `pid@host`), None if absent or unreadable."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    try:
        info = json.loads(text)
        if isinstance(info, dict) and isinstance(info.get("pid"), int):
            return info
        if isinstance(info, int):
            return {"pid": info}
    except json.JSONDecodeError:
        pass
    parts = text.replace("@", " ").replace(":", " ").split()
    if parts and parts[0].isdigit():
        return {"pid": int(parts[0]), **({"host": parts[1]} if len(parts) > 1 else {})}
    return None


def is_local(info: dict) -> bool:
    return info.get("host") in (None, socket.gethostname())


def alive(info: dict | None) -> bool:
    """Is the recorded process still running on this host (not a zombie, not a recycled pid)?

    A process on another host cannot be checked from here and counts as alive."""
    if not info:
        return False
    if not is_local(info):
        return True
    pid = info["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _proc_stat(pid)
    if fields is None:
        return not Path("/proc/self/stat").exists()  # no /proc on this OS: trust kill(0)
    if fields[0] in ("Z", "X"):
        return False
    recorded = info.get("start_ticks")
    return recorded is None or int(fields[19]) == recorded


def terminate(info: dict) -> None:
    """SIGTERM the process group the UI started (pgid == pid), else the pid alone (a run started elsewhere)."""
    pid = info["pid"]
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
