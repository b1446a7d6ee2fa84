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
from dataclasses import dataclass, field, fields
from typing import Callable, Optional

from tinyrl.errors import ConfigError
from tinyrl.monitor_rules import RULES, Finding, Rule, Severity

log = logging.getLogger("tinyrl.monitor")

__all__ = ["ACTIONS", "RULES", "Alarm", "Finding", "Monitor", "MonitorConfig", "Rule", "apply_action"]


@dataclass
class Alarm:
    name: str
    step: int
    evidence: str
    action: str  # what to change, in words (config keys where possible)
    fatal: bool = False  # the trainer stops the run (StaleWeightsError)
    action_key: Optional[str] = None  # an entry of ACTIONS that can fix it automatically
    applied: Optional[str] = None  # what apply_action did, when its switch was on
    severity: Severity = "alarm"  # "warning": a notice, not a sign the run is failing


@dataclass
class MonitorConfig:
    """Every rule threshold, timing and auto-action switch (the run config's `monitor` section).

    Timing, per rule: `<rule>_steps` consecutive steps the condition must hold before the rule
    fires; `<rule>_cooldown` steps it then stays quiet (0: it may fire on the next step again).
    """

    # shared
    window: int = 5  # steps in a rolling window
    baseline_steps: int = 3  # the first steps define the early-run entropy / length / reward
    median_window: int = 20  # steps behind the rolling medians (grad norm, update KL, clip frac)
    reward_max: float = 1.0  # reward of a perfect answer (with several rewards summed: their max total)
    reward_high_frac: float = 0.9  # "reward is high" means >= reward_high_frac * reward_max
    reward_rise: float = 0.05  # "reward rises": its recent mean is this much above its earlier mean
    # entropy_collapse: token entropy far below its early value (relative) and low (absolute)
    entropy_collapse_frac: float = 0.3  # below this fraction of its early-run value ...
    entropy_collapse_abs: float = 0.5  # ... and below this many nats per token (a 2-nat LLM at 0.55 still explores)
    entropy_collapse_steps: int = 2
    entropy_collapse_cooldown: int = 50
    # advantage_collapse: most groups carry no learning signal
    zero_std_max: float = 0.9  # window mean of zero_std_frac above this (a sparse reward that learns sits at 0.5-0.8)
    advantage_collapse_steps: int = 1  # (the window mean is the noise guard)
    advantage_collapse_cooldown: int = 50
    # echo_trap: the within-group spread falls on its own
    echo_drop: float = 0.5  # group reward std (window median) falls by more than this fraction ...
    echo_min_std: float = 0.1  # ... from a window median of at least this, ...
    echo_entropy_drop: float = 0.2  # ... and token entropy (window mean) falls by more than this fraction
    echo_trap_steps: int = 2
    echo_trap_cooldown: int = 50
    # lazy_likelihood: the update lowers what it reinforces
    lld_nonpos_frac: float = 0.5  # mean frac_pos_delta_nonpos over lld_nonpos_steps above this ...
    lld_delta_floor: float = 0.01  # ... and their mean logp_pos_delta below -this (nats per token) ...
    lld_nonpos_steps: int = 3  # ... (short: an overshooting step size shows here first)
    lld_windows: int = 3  # or: windows in a row, each with lower correct-response likelihood ...
    lld_fall_min: float = 0.05  # ... falling by at least this much in all (nats per token)
    lazy_likelihood_steps: int = 1
    lazy_likelihood_cooldown: int = 50
    # gradient_explosion: a grad-norm spike (relative and absolute), or a skipped non-finite step
    grad_explosion_factor: float = 5.0  # grad norm above this multiple of its rolling median ...
    grad_explosion_floor: float = 5.0  # ... and above this (pre-clip norm)
    gradient_explosion_steps: int = 1
    gradient_explosion_cooldown: int = 0  # every skipped step is reported
    # kl_blowup: the policy runs away from the reference, or one update moves it far
    kl_accel_factor: float = 3.0  # ref-KL slope over the last window vs the window before
    kl_floor: float = 0.05  # ref-KL below this is never a blow-up
    update_kl_factor: float = 10.0  # update_kl above this multiple of its rolling median ...
    update_kl_floor: float = 0.1  # ... and above this (k3 per token)
    update_kl_max: float = 0.2  # or: update_kl above this whatever its median (healthy tiny runs: <= 0.08)
    clip_frac_factor: float = 5.0  # update_clip_frac above this multiple of its rolling median ...
    clip_frac_floor: float = 0.2  # ... and above this
    kl_blowup_steps: int = 2
    kl_blowup_cooldown: int = 50
    # stale_weights (the canary): the engine does not sample from the trained weights
    stale_k3: float = 1e-3  # rollout-vs-trainer k3 per token above this (from step 2) ...
    stale_noise_factor: float = 10.0  # ... and above this multiple of step 1's (the numeric noise floor)
    stale_maxdiff: Optional[float] = None  # also alarm on max |logp diff| above this (None: off)
    stale_fatal: bool = True  # stale weights stop the run
    stale_weights_steps: int = 1
    stale_weights_cooldown: int = 50
    # length_shortcut: shorter answers are rewarded without being right
    length_drop: float = 0.5  # completion length falls by more than this fraction ...
    length_drop_min: float = 4.0  # ... and by at least this many tokens,
    length_empty_max: float = 1.5  # ... or to at most this many (next to empty: an end-of-text token alone)
    length_shortcut_steps: int = 1
    length_shortcut_cooldown: int = 50
    # length_explosion: completions grow into the length cap
    length_explosion_trunc: float = 0.4  # this step's truncated_frac above this ...
    length_explosion_base: float = 0.2  # ... from an early-run truncated_frac below this ...
    length_explosion_growth: float = 0.25  # ... and completion_len more than this fraction above its early value
    length_explosion_steps: int = 2
    length_explosion_cooldown: int = 50
    # tool_use_collapse (multi-turn): the agent stops calling its tools
    tool_used_min: float = 0.5  # "tools were used": a window mean of tool_calls_per_traj reached this ...
    tool_collapse_frac: float = 0.1  # ... and the latest window mean fell below this fraction of its peak
    tool_use_collapse_steps: int = 2
    tool_use_collapse_cooldown: int = 50
    # tool_loop (multi-turn): the agent calls tools instead of answering
    max_turns_pin: float = 0.9  # window mean of max_turns_frac above this
    tool_loop_steps: int = 2
    tool_loop_cooldown: int = 50
    # tool_errors (multi-turn): most tool calls fail
    tool_error_max: float = 0.5  # window mean of tool_error_rate above this ...
    tool_error_min_calls: float = 0.2  # ... while the agent makes at least this many calls per trajectory
    tool_errors_steps: int = 2
    tool_errors_cooldown: int = 50
    # truncation (a warning)
    truncation_max: float = 0.05  # window mean of truncated_frac above this
    truncation_steps: int = 2
    truncation_cooldown: int = 50

    disabled: list[str] = field(default_factory=list)  # rule names to skip
    auto_dynamic_sampling: bool = False  # advantage_collapse -> algo.dynamic_sampling = true
    auto_clip_higher: bool = False  # entropy_collapse -> raise epsilon_high to auto_epsilon_high
    auto_epsilon_high: float = 0.28
    auto_rollback: bool = False  # gradient_explosion -> reload weights + optimizer from the last checkpoint
    max_rollbacks: int = 3

    def validate(self, p: str = "monitor") -> None:
        bad = [f.name for f in fields(self) if f.name not in ("disabled", "stale_maxdiff")
               and isinstance(getattr(self, f.name), (int, float)) and getattr(self, f.name) < 0]
        if bad:
            raise ConfigError(f"{p}.{bad[0]}: must be >= 0, got {getattr(self, bad[0])}")
        ones = ["window", "baseline_steps", "lld_windows", "lld_nonpos_steps", "median_window"]
        for name in ones + [f"{r}_steps" for r in RULES]:
            if getattr(self, name) < 1:
                raise ConfigError(f"{p}.{name}: must be >= 1, got {getattr(self, name)}")
        unknown = [r for r in self.disabled if r not in RULES]
        if unknown:
            raise ConfigError(f"{p}.disabled: unknown rule {unknown[0]!r}; rules: {sorted(RULES)}")


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
            self.fired.append(alarm.__dict__)  # the live dict: apply_action's `applied` shows up here too
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


def _dynamic_sampling(trainer) -> str:
    if trainer.cfg.algo.dynamic_sampling:
        return "algo.dynamic_sampling was already on; nothing changed"
    trainer.cfg.algo.dynamic_sampling = True
    return "turned on algo.dynamic_sampling (groups with identical rewards are dropped and resampled)"


def _raise_epsilon_high(trainer) -> str:
    old, new = trainer.cfg.algo.epsilon_high, trainer.monitor.cfg.auto_epsilon_high
    if old >= new:
        return f"epsilon_high is already {old:g} (>= monitor.auto_epsilon_high); nothing changed"
    trainer.cfg.algo.epsilon_high = new  # the loss reads cfg.algo: one source of truth
    return f"raised epsilon_high {old:g} -> {new:g} (clip-higher)"


def _rollback(trainer) -> str:
    """Reload the adapter weights and optimizer state of the last checkpoint. Step count, LR
    schedule, data order and RNG go on: replaying the same batches would repeat the explosion."""
    mon, ckpt = trainer.monitor, trainer.run.latest_checkpoint()
    if ckpt is None:
        return "no checkpoint to roll back to (set train.save_every); nothing changed"
    if mon.rollbacks >= mon.cfg.max_rollbacks:
        return f"rolled back {mon.rollbacks} times already (monitor.max_rollbacks); nothing changed"
    from peft import set_peft_model_state_dict

    from tinyrl import checkpoint

    try:
        data = checkpoint.read(ckpt)
    except checkpoint.CorruptCheckpoint as e:
        return f"the last checkpoint does not load ({e}); nothing changed"
    set_peft_model_state_dict(trainer.model, data.weights)
    trainer.optimizer.load_state_dict(data.state["optimizer"])
    trainer.engine.sync(trainer.model)  # the engine must sample from the restored weights
    mon.rollbacks += 1
    return f"rolled back adapter weights and optimizer to {ckpt.name} (rollback {mon.rollbacks}/{mon.cfg.max_rollbacks})"


# action key -> (the MonitorConfig switch that enables it, the action)
ACTIONS: dict[str, tuple[str, Callable[[object], str]]] = {
    "dynamic_sampling": ("auto_dynamic_sampling", _dynamic_sampling),
    "raise_epsilon_high": ("auto_clip_higher", _raise_epsilon_high),
    "rollback": ("auto_rollback", _rollback),
}


def apply_action(trainer, alarm: Alarm) -> Optional[str]:
    """Run the alarm's automatic action if its switch in trainer.monitor.cfg is on; record and
    return what was done (None: no action, or switched off)."""
    if alarm.action_key is None:
        return None
    switch, act = ACTIONS[alarm.action_key]
    if not getattr(trainer.monitor.cfg, switch):
        return None
    alarm.applied = act(trainer)
    log.warning("monitor auto-action for %s at step %d: %s", alarm.name, alarm.step, alarm.applied)
    return alarm.applied
