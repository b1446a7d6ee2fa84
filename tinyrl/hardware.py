"""What this machine has, read the same way by the planner and the model code (no tinyrl imports)."""

from __future__ import annotations

import os


def host_memory() -> int:
    """This machine's RAM (MemTotal), the budget of a CPU plan."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
