"""Reading the monitor's metric history (a list of metrics rows, oldest first): window means, medians,
slopes and spikes over the measured values. A metric that was not measured is absent or None and is
left out; `window_mean` is None unless every row of its window has the metric."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from tinyrl.config.schema_monitor import MonitorConfig


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def vals(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if finite(r.get(key))]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


def slope(ys: list[float]) -> float:
    """Least-squares slope of ys against 0..n-1."""
    n = len(ys)
    xm, ym = (n - 1) / 2, mean(ys)
    den = sum((i - xm) ** 2 for i in range(n))
    return sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / den if den else 0.0


def window_mean(h: list[dict], key: str, n: int) -> Optional[float]:
    """Mean of `key` over the last n rows, or None unless all n have it (absent: not measured)."""
    xs = vals(h[-n:], key)
    return mean(xs) if len(xs) == n else None


def reward_high(rows: list[dict], c: MonitorConfig) -> tuple[bool, float]:
    r = mean(vals(rows, "reward_mean"))
    return (not math.isnan(r) and r >= c.reward_high_frac * c.reward_max), r


def spike(h: list[dict], key: str, factor: float, floor: float, c: MonitorConfig) -> Optional[tuple[float, float]]:
    """(latest, rolling median) when the latest value is > factor x its rolling median and > floor.
    Steps that took no optimiser step (skipped_no_signal) are left out of the median."""
    past = vals([r for r in h[-c.median_window - 1:-1] if not r.get("skipped_no_signal")], key)
    x = h[-1].get(key)
    if not finite(x) or len(past) < c.window:
        return None
    med = median(past)
    return (x, med) if x > floor and x > factor * med else None
