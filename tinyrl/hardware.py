"""What this machine has, read the same way by the planner, the config and the model code (no tinyrl imports)."""

from __future__ import annotations

import os

BF16_FROM = 80  # bf16 tensor cores and kernels from sm_80 (Ampere); a T4 (sm_75) emulates bf16 slowly


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


def cuda_capability() -> int | None:
    """This process's CUDA card as 10 * major + minor (80 for an A100), or None without one."""
    import torch  # lazy: the config and the planner ask this only when deciding `auto`

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


def compute_dtype(capability: int | None) -> str:
    """`model.dtype: auto`: float32 on a CPU, bfloat16 from sm_80, float16 below (no bf16 there).

    >>> [compute_dtype(c) for c in (None, 75, 80, 86, 89, 90)]
    ['float32', 'float16', 'bfloat16', 'bfloat16', 'bfloat16', 'bfloat16']
    """
    if capability is None:
        return "float32"
    return "bfloat16" if capability >= BF16_FROM else "float16"
