"""Cards the planner knows by name, memory strings ("24GB"), and the budget a plan is checked against."""

from __future__ import annotations

import re

from tinyrl.errors import ConfigError
from tinyrl.hardware import host_memory  # noqa: F401 - the planner's name for it

MiB = 2**20

# Total memory as nvidia-smi reports it (MiB) for the common variant of each card.
GPUS: dict[str, int] = {
    "T4": 15360 * MiB,
    "L4": 23034 * MiB,
    "A10": 23028 * MiB,
    "4090": 24564 * MiB,
    "A100-40": 40960 * MiB,
    "A100-80": 81920 * MiB,
    "H100": 81559 * MiB,
    "H200": 143771 * MiB,
}

# Hardware profiles of the shipped presets -> the card `tinyrl plan --profile NAME` assumes.
PROFILE_GPUS: dict[str, str] = {"16gb": "T4", "24gb": "L4", "80gb": "H100", "8xh100": "H100"}

_UNITS = {"": 2**30, "g": 2**30, "gb": 2**30, "gib": 2**30, "m": MiB, "mb": MiB, "mib": MiB,
          "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_memory(text: str) -> int:
    """'24GB' / '24GiB' / '24' (GiB) / '23034MiB' -> bytes. GB is read as GiB, as nvidia-smi does.

    >>> parse_memory("24GB") == 24 * 2**30, parse_memory("512MiB") == 512 * 2**20
    (True, True)
    >>> parse_memory("0")
    Traceback (most recent call last):
    ...
    tinyrl.errors.ConfigError: --gpu-mem '0': must be a size above 0, like 24GB, 16GiB or 23034MiB
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"--gpu-mem {text!r}: expected a size like 24GB, 16GiB or 23034MiB")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:  # a plan of a card with no memory divides by zero; nothing fits on it anyway
        raise ConfigError(f"--gpu-mem {text!r}: must be a size above 0, like 24GB, 16GiB or 23034MiB")
    return n


def gpu_bytes(name: str) -> int:
    key = {k.lower(): k for k in GPUS}.get(str(name).lower().removeprefix("rtx").strip("- "))
    if key is None:
        raise ConfigError(f"--gpu {name!r}: must be one of {list(GPUS)} (or give --gpu-mem, e.g. 24GB)")
    return GPUS[key]


def world_size_of(profile: str | None) -> int:
    """'8xh100' -> 8 processes (one per card); anything else -> 1.

    >>> world_size_of("8xh100"), world_size_of("24gb"), world_size_of(None)
    (8, 1, 1)
    """
    m = re.match(r"(\d+)x", profile or "")
    return int(m.group(1)) if m else 1


