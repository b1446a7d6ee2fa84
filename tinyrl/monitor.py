"""Step metrics history and failure-mode alarms.

`Monitor.update(step, metrics)` appends the step's metrics, runs every alarm rule in
`RULES` over the history, and returns the alarms that fired for the first time. Each alarm
carries its evidence and a suggested action. Rules are plain functions
`rule(history, cfg) -> (evidence) | None` so new ones are one entry in the table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable


@dataclass
class Alarm:
    name: str
    step: int
    evidence: str
    action: str
    fatal: bool = False


@dataclass
class MonitorConfig:
    window: int = 5
    grad_explosion_factor: float = 5.0


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def grad_explosion(history: list[dict], cfg: MonitorConfig) -> tuple[str, str] | None:
    last = history[-1]
    g = last.get("grad_norm")
    if last.get("skipped_nonfinite"):
        return (f"non-finite loss or gradient at step {last['step']}; the step was skipped (weights untouched)",
                "lower train.lr, raise train.max_grad_norm headroom, or check the reward scale")
    past = [h["grad_norm"] for h in history[-(cfg.window * 4) - 1:-1] if _finite(h.get("grad_norm"))]
    if _finite(g) and len(past) >= cfg.window:
        med = sorted(past)[len(past) // 2]
        if med > 0 and g > cfg.grad_explosion_factor * med:
            return (f"grad norm {g:.3g} is {g / med:.1f}x its rolling median {med:.3g}",
                    "lower train.lr or train.max_grad_norm; check for a reward outlier")
    return None


RULES: dict[str, tuple[Callable[[list[dict], MonitorConfig], tuple[str, str] | None], bool]] = {
    # name: (rule, fatal)
    "gradient_explosion": (grad_explosion, False),
}


@dataclass
class Monitor:
    cfg: MonitorConfig = field(default_factory=MonitorConfig)
    history: list[dict] = field(default_factory=list)
    fired: list[dict] = field(default_factory=list)

    def update(self, step: int, metrics: dict) -> list[Alarm]:
        self.history.append({"step": step, **metrics})
        new = []
        for name, (rule, fatal) in RULES.items():
            hit = rule(self.history, self.cfg)
            if hit is None:
                continue
            alarm = Alarm(name, step, hit[0], hit[1], fatal)
            if name == "gradient_explosion" or not any(a["name"] == name for a in self.fired):
                self.fired.append(asdict(alarm))
                new.append(alarm)
        return new

    def state_dict(self) -> dict:
        return {"history": self.history, "fired": self.fired}

    def load_state_dict(self, state: dict) -> None:
        self.history, self.fired = list(state["history"]), list(state["fired"])
