"""Training health: failure-mode alarms over the step metrics, and optional automatic fixes.

`Monitor.update(step, metrics)` appends the step's metrics row (the row the trainer writes to
metrics.jsonl) to the history and runs every rule of `RULES` over it. Each rule is a condition
on the history up to this step (`check(history, cfg) -> Finding | None`); the monitor raises it
when the condition has held for `<rule>_steps` consecutive steps, and then keeps the rule quiet
for `<rule>_cooldown` steps (0: it may fire again on the next step it holds). One mechanism for
every rule; all thresholds and timings live in `MonitorConfig`.

Each rule has a severity. An `alarm` says the run is going wrong; a `warning` is a notice that
does not (a share of completions hits the length cap). Both are returned, logged and written
to alarms.jsonl with their severity; only alarms make the report's verdict "NEEDS A LOOK", and
`benchmarks/monitor_calibration.py` counts only alarms as false positives on healthy runs.

The rules themselves (what each detects, its floors) live in `tinyrl.monitor_rules`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tinyrl.config.schema_monitor import MonitorConfig
from tinyrl.monitor_rules import RULES, Finding, Rule, Severity

log = logging.getLogger("tinyrl.monitor")

__all__ = ["ACTIONS", "RULES", "Action", "Alarm", "Finding", "Monitor", "MonitorConfig", "Rule", "planned_action"]


@dataclass
class Alarm:
    name: str
    step: int
    evidence: str
    action: str  # what to change, in words (config keys where possible)
    fatal: bool = False  # the trainer stops the run (StaleWeightsError)
    action_key: Optional[str] = None  # an entry of ACTIONS that can fix it automatically
    applied: Optional[str] = None  # what its automatic action did, when its switch was on
    severity: Severity = "alarm"  # "warning": a notice, not a sign the run is failing


# --------------------------------------------------------------------------- the monitor


@dataclass
class Monitor:
    cfg: MonitorConfig = field(default_factory=MonitorConfig)
    history: list[dict] = field(default_factory=list)
    fired: list[dict] = field(default_factory=list)  # every alarm and warning raised (alarms.jsonl rows)
    rollbacks: int = 0
    streak: dict[str, int] = field(default_factory=dict)  # consecutive steps each rule's condition held
    quiet_until: dict[str, int] = field(default_factory=dict)  # a rule in cool-down fires after this step

    def update(self, step: int, metrics: dict) -> list[Alarm]:
        """Add the step's row; return the alarms and warnings raised at this step."""
        self.history.append({**metrics, "step": step})
        new = []
        for name, rule in RULES.items():
            if name in self.cfg.disabled:
                continue
            hit = rule.check(self.history, self.cfg)
            self.streak[name] = self.streak.get(name, 0) + 1 if hit else 0
            if hit is None or self.streak[name] < getattr(self.cfg, f"{name}_steps"):
                continue
            if step <= self.quiet_until.get(name, -math.inf):
                continue
            self.quiet_until[name] = step + getattr(self.cfg, f"{name}_cooldown")
            alarm = Alarm(name, step, hit.evidence, hit.action, hit.fatal, rule.action_key, severity=rule.severity)
            self.fired.append(alarm.__dict__)  # the live dict: an action's `applied` shows up here too
            new.append(alarm)
        return new

    @property
    def alarms(self) -> list[dict]:
        """What fired with severity "alarm" (the warnings left out)."""
        return [a for a in self.fired if a.get("severity", "alarm") == "alarm"]

    def state_dict(self) -> dict:
        return {"history": self.history, "fired": self.fired, "rollbacks": self.rollbacks,
                "streak": self.streak, "quiet_until": self.quiet_until}

    def load_state_dict(self, state: dict) -> None:
        self.history, self.fired = list(state["history"]), [dict(a) for a in state["fired"]]
        self.rollbacks = state.get("rollbacks", 0)
        self.streak = dict(state.get("streak", {}))
        if "quiet_until" in state:
            self.quiet_until = dict(state["quiet_until"])
        else:  # a checkpoint from before cool-downs: each rule that fired is quiet for its cool-down from then
            self.quiet_until = {a["name"]: a["step"] + getattr(self.cfg, f"{a['name']}_cooldown", 0)
                                for a in self.fired if a["name"] in RULES}


# --------------------------------------------------------------------------- automatic actions


@dataclass
class Action:
    """What an automatic action does: set config fields (the trainer keeps the patch in its state,
    so checkpoints carry it), or roll the adapter back to the last checkpoint (the trainer's own)."""

    message: str  # what it does, in words (alarms.jsonl `applied`)
    patch: dict[str, Any] = field(default_factory=dict)  # dotted config field -> value
    rollback: bool = False


def _dynamic_sampling(cfg, mcfg: MonitorConfig) -> Action:
    if cfg.algo.dynamic_sampling:
        return Action("algo.dynamic_sampling was already on; nothing changed")
    return Action("turned on algo.dynamic_sampling (groups with identical rewards are dropped and resampled)",
                  {"algo.dynamic_sampling": True})


def _raise_epsilon_high(cfg, mcfg: MonitorConfig) -> Action:
    old, new = cfg.algo.epsilon_high, mcfg.auto_epsilon_high
    if old >= new:
        return Action(f"epsilon_high is already {old:g} (>= monitor.auto_epsilon_high); nothing changed")
    return Action(f"raised epsilon_high {old:g} -> {new:g} (clip-higher)", {"algo.epsilon_high": new})


def _rollback(cfg, mcfg: MonitorConfig) -> Action:
    return Action("roll back to the last checkpoint", rollback=True)


# action key -> (the MonitorConfig switch that enables it, the action)
ACTIONS: dict[str, tuple[str, Callable[[Any, MonitorConfig], Action]]] = {
    "dynamic_sampling": ("auto_dynamic_sampling", _dynamic_sampling),
    "raise_epsilon_high": ("auto_clip_higher", _raise_epsilon_high),
    "rollback": ("auto_rollback", _rollback),
}


def planned_action(monitor: Monitor, alarm: Alarm, cfg) -> Optional[Action]:
    """The automatic action for `alarm` under the run config `cfg`, if its switch is on (None otherwise)."""
    if alarm.action_key is None:
        return None
    switch, act = ACTIONS[alarm.action_key]
    if not getattr(monitor.cfg, switch):
        return None
    return act(cfg, monitor.cfg)
