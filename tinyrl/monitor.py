"""Training health: failure-mode alarms over the step metrics, and optional automatic fixes.

`Monitor.update(step, metrics)` appends the step's metrics row (the same row the trainer
writes to metrics.jsonl) to the history, runs every rule in `RULES` over it, and returns
the alarms that fired for the first time (a rule marked `repeat` fires on every step it
holds). Each alarm carries its evidence, a suggested action, and, where one exists, the
name of an automatic action in `ACTIONS`; `apply_action(trainer, alarm)` performs that
action when its `MonitorConfig` switch is on (all off by default).

Rules are plain functions `rule(history, cfg) -> Finding | None`, one row of the `RULES`
table each; every threshold lives in `MonitorConfig`. The rules, in order:

    entropy_collapse          entropy < 30% of its early-run value while reward is not high
    advantage_collapse        > 50% of groups have zero reward std over a window
    echo_trap                 within-group reward std falls > 50% below its recent median
                              while reward holds (neither high nor falling)
    lazy_likelihood           correct responses' likelihood falls while reward rises, or the
                              update lowers it for most of them (also: a step size too large)
    gradient_explosion        grad norm > 5x its rolling median, or a non-finite step (skipped)
    kl_blowup                 KL to the reference grows faster than linearly; policy KL /
                              update clip fraction (tokens whose ratio the step moved
                              past the clip range) far above their rolling median
    stale_weights (canary)    rollout-vs-trainer logprob mismatch after a weight sync: fatal
    length_shortcut           completion length falls > 50% while reward rises
    truncation                > 5% of completions hit max_new_tokens
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from typing import Callable, NamedTuple, Optional

from tinyrl.errors import ConfigError

log = logging.getLogger("tinyrl.monitor")


@dataclass
class Alarm:
    name: str
    step: int
    evidence: str
    action: str  # what to change, in words (config keys where possible)
    fatal: bool = False  # the trainer stops the run (StaleWeightsError)
    action_key: Optional[str] = None  # an entry of ACTIONS that can fix it automatically
    applied: Optional[str] = None  # what apply_action did, when its switch was on


@dataclass
class MonitorConfig:
    """Every rule threshold and the auto-action switches (the run config's `monitor` section)."""

    window: int = 5  # steps in a rolling window
    confirm_steps: int = 2  # a condition must hold this many consecutive steps (noise guard)
    baseline_steps: int = 3  # the first steps define the early-run entropy / length / reward
    reward_max: float = 1.0  # reward of a perfect answer (with several rewards summed: their max total)
    reward_high_frac: float = 0.9  # "reward is high" means >= reward_high_frac * reward_max
    reward_rise: float = 0.05  # "reward rises": its recent mean is this much above its earlier mean
    entropy_collapse_frac: float = 0.3  # entropy below this fraction of its early-run value
    zero_std_max: float = 0.5  # mean zero_std_frac over a window above this
    echo_drop: float = 0.5  # group reward std falls by more than this fraction of its recent median
    lld_windows: int = 3  # windows in a row, each with lower correct-response likelihood
    lld_nonpos_frac: float = 0.5  # mean frac_pos_delta_nonpos over lld_nonpos_steps above this ...
    lld_nonpos_steps: int = 3  # ... (short: an overshooting step size shows here first)
    grad_explosion_factor: float = 5.0  # grad norm above this multiple of its rolling median
    median_window: int = 20  # steps behind the rolling medians (grad norm, policy KL, clip frac)
    kl_accel_factor: float = 3.0  # ref-KL slope over the last window vs the window before
    kl_floor: float = 0.01  # ref-KL below this is never a blow-up
    policy_kl_factor: float = 10.0
    policy_kl_floor: float = 1e-3
    clip_frac_factor: float = 5.0
    clip_frac_floor: float = 0.1
    stale_k3: float = 1e-3  # rollout-vs-trainer k3 per token above this (from step 2) ...
    stale_noise_factor: float = 10.0  # ... and above this multiple of step 1's (the numeric noise floor)
    stale_maxdiff: Optional[float] = None  # also alarm on max |logp diff| above this (None: off)
    stale_fatal: bool = True  # stale weights stop the run
    length_drop: float = 0.5  # completion length falls by more than this fraction
    truncation_max: float = 0.05  # truncated_frac over a window above this
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
        for name in ("window", "confirm_steps", "baseline_steps", "lld_windows", "lld_nonpos_steps", "median_window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{p}.{name}: must be >= 1, got {getattr(self, name)}")
        unknown = [r for r in self.disabled if r not in RULES]
        if unknown:
            raise ConfigError(f"{p}.disabled: unknown rule {unknown[0]!r}; rules: {sorted(RULES)}")


class Finding(NamedTuple):
    evidence: str
    action: str
    fatal: bool = False


# --------------------------------------------------------------------------- helpers


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _vals(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if _finite(r.get(key))]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


def _slope(ys: list[float]) -> float:
    """Least-squares slope of ys against 0..n-1."""
    n = len(ys)
    xm, ym = (n - 1) / 2, _mean(ys)
    den = sum((i - xm) ** 2 for i in range(n))
    return sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / den if den else 0.0


def _reward_not_high(rows: list[dict], c: MonitorConfig) -> tuple[bool, float]:
    r = _mean(_vals(rows, "reward_mean"))
    return (not math.isnan(r) and r < c.reward_high_frac * c.reward_max), r


def _spike(h: list[dict], key: str, factor: float, floor: float, c: MonitorConfig) -> Optional[tuple[float, float]]:
    """(latest, rolling median) when the latest value is > factor x median and > floor."""
    past = _vals(h[-c.median_window - 1:-1], key)
    x = h[-1].get(key)
    if not _finite(x) or len(past) < c.window:
        return None
    med = _median(past)
    return (x, med) if x > floor and x > factor * med else None


# --------------------------------------------------------------------------- rules


def entropy_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    if len(h) < c.baseline_steps + c.confirm_steps:
        return None
    base = _mean(_vals(h[: c.baseline_steps], "entropy"))
    recent = _vals(h[-c.confirm_steps:], "entropy")
    low, r = _reward_not_high(h[-c.confirm_steps:], c)
    if not (base > 0 and len(recent) == c.confirm_steps and low):
        return None
    if all(e < c.entropy_collapse_frac * base for e in recent):
        return Finding(f"mean token entropy {recent[-1]:.3g} is {recent[-1] / base:.0%} of its early-run value "
                       f"{base:.3g} while reward is {r:.3f} (< {c.reward_high_frac:g} x {c.reward_max:g})",
                       "clip-higher (algo.epsilon_high=0.28, with algo.num_iterations>=2), a top-entropy token "
                       "mask (algo.top_entropy_quantile=0.2), or a lower train.lr")
    return None


def advantage_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    z = _vals(h[-c.window:], "zero_std_frac")
    if len(z) < c.window or _mean(z) <= c.zero_std_max:
        return None
    r = _mean(_vals(h[-c.window:], "reward_mean"))
    why = "all solved: the task is too easy" if r >= c.reward_high_frac * c.reward_max else "no signal to learn from"
    return Finding(f"{_mean(z):.0%} of groups had identical rewards (zero advantage) over the last {c.window} "
                   f"steps; reward {r:.3f} ({why})",
                   "turn on dynamic sampling (algo.dynamic_sampling=true) or use an easier curriculum "
                   "(a harder one if reward is already high)")


def echo_trap(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Window medians, so a few unlucky batches of a sparse reward do not count; and the spread
    must fall on its own: fewer successes (reward falling too) is advantage collapse, not echo."""
    if len(h) < 2 * c.window:
        return None
    ref, now = h[-2 * c.window:-c.window], h[-c.window:]
    s_ref, s_now = _vals(ref, "reward_group_std"), _vals(now, "reward_group_std")
    low, _ = _reward_not_high(now[-c.confirm_steps:], c)
    r_ref, r_now = _mean(_vals(ref, "reward_mean")), _mean(_vals(now, "reward_mean"))
    if len(s_ref) < c.window or len(s_now) < c.window or not low or not r_now >= (1 - c.echo_drop) * r_ref:
        return None
    med, cur = _median(s_ref), _median(s_now)
    if med > 1e-6 and cur < (1 - c.echo_drop) * med:
        return Finding(f"within-group reward std (median of the last {c.window} steps) {cur:.3g} fell "
                       f"{1 - cur / med:.0%} below its median {med:.3g} just before, while reward holds at "
                       f"{r_now:.3f}: each group's samples echo one answer",
                       "raise rollout.temperature, turn on algo.dynamic_sampling, or lower train.lr")
    return None


def lazy_likelihood(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    action = "turn on LLDS: algo.llds_lambda=0.2 with algo.num_iterations>=2"
    nonpos = _vals(h[-c.lld_nonpos_steps:], "frac_pos_delta_nonpos")
    if len(nonpos) == c.lld_nonpos_steps and _mean(nonpos) > c.lld_nonpos_frac:
        return Finding(f"the update lowered the likelihood of {_mean(nonpos):.0%} of the positive-advantage "
                       f"responses it was meant to reinforce (mean over the last {c.lld_nonpos_steps} steps)",
                       f"{action}; if reward is falling too, the step is too large: lower train.lr "
                       "(and keep train.max_grad_norm ~1)")
    n = c.lld_windows * c.window
    if len(h) < n:
        return None
    chunks = [h[-n + i * c.window: len(h) - n + (i + 1) * c.window] for i in range(c.lld_windows)]
    lp = [_mean(_vals(ch, "logp_pos_mean")) for ch in chunks]
    rw = [_mean(_vals(ch, "reward_mean")) for ch in chunks]
    if any(math.isnan(x) for x in lp + rw):
        return None
    falling = all(b < a for a, b in zip(lp, lp[1:]))
    if falling and rw[-1] > rw[0] + c.reward_rise:
        return Finding(f"log-likelihood per token of correct responses fell for {c.lld_windows} windows of "
                       f"{c.window} steps ({lp[0]:.3f} -> {lp[-1]:.3f}) while reward rose ({rw[0]:.3f} -> {rw[-1]:.3f})",
                       action)
    return None


def grad_explosion(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    last = h[-1]
    if last.get("skipped_nonfinite"):
        return Finding(f"non-finite loss or gradient at step {last['step']}; the step was skipped (weights untouched)",
                       "lower train.lr, raise train.max_grad_norm headroom, or check the reward scale")
    hit = _spike(h, "grad_norm", c.grad_explosion_factor, 0.0, c)
    if hit and hit[1] > 0:  # a median of 0 (no signal for a while) makes any gradient look infinite
        g, med = hit
        return Finding(f"grad norm {g:.3g} is {g / med:.1f}x its rolling median {med:.3g}",
                       "lower train.lr or train.max_grad_norm; check for a reward outlier")
    return None


def kl_blowup(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    action = "lower train.lr, raise algo.beta, or tighten algo.epsilon_low/epsilon_high"
    kl = _vals(h, "ref_kl")
    if len(kl) >= 3 * c.window and kl[-1] > c.kl_floor:  # the first window is warm-up (KL starts ~quadratic)
        old, new = _slope(kl[-2 * c.window:-c.window]), _slope(kl[-c.window:])
        if new > c.kl_accel_factor * max(old, c.kl_floor / c.window):
            return Finding(f"KL to the reference {kl[-1]:.3g} is accelerating: slope {new:.3g}/step over the last "
                           f"{c.window} steps vs {old:.3g}/step before (> {c.kl_accel_factor:g}x)", action)
    checks = (("update_kl", c.policy_kl_factor, c.policy_kl_floor), ("update_clip_frac", c.clip_frac_factor, c.clip_frac_floor))
    for key, factor, floor in checks:
        hit = _spike(h, key, factor, floor, c)
        if hit:
            return Finding(f"{key} {hit[0]:.3g} is far above its rolling median {hit[1]:.3g}", action)
    return None


def stale_weights(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Every row from step 2 on is measured on rollouts sampled after the previous step's sync;
    step 1 samples from the initial weights both sides share, so its mismatch is the noise floor."""
    last = h[-1]
    k3, md = last.get("rollout_trainer_k3"), last.get("rollout_trainer_maxdiff")
    if last.get("step", 0) < 2 or not _finite(k3):
        return None
    floor = next((r.get("rollout_trainer_k3") for r in h if r.get("step") == 1), None)
    limit = max(c.stale_k3, c.stale_noise_factor * floor if _finite(floor) else 0.0)
    over_md = c.stale_maxdiff is not None and _finite(md) and md > c.stale_maxdiff
    if k3 > limit or over_md:
        return Finding(f"rollout-engine vs trainer logprobs disagree right after a weight sync: k3 {k3:.3g}/token "
                       f"(limit {limit:.3g}), max |diff| {md if md is not None else float('nan'):.3g}; the engine "
                       "is not sampling from the trained weights",
                       "check that engine.sync(model) pushes the LoRA adapter (vLLM: the adapter is reloaded, "
                       "not cached); set monitor.stale_fatal=false to only warn", c.stale_fatal)
    return None


def length_shortcut(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    if len(h) < c.baseline_steps + c.window:
        return None
    base_len, cur_len = _mean(_vals(h[: c.baseline_steps], "completion_len")), _mean(_vals(h[-c.window:], "completion_len"))
    base_r, cur_r = _mean(_vals(h[: c.baseline_steps], "reward_mean")), _mean(_vals(h[-c.window:], "reward_mean"))
    if base_len > 0 and cur_len < (1 - c.length_drop) * base_len and cur_r > base_r + c.reward_rise:
        return Finding(f"completion length fell {1 - cur_len / base_len:.0%} ({base_len:.1f} -> {cur_len:.1f} tokens) "
                       f"while reward rose ({base_r:.3f} -> {cur_r:.3f})",
                       "read samples.jsonl: if short answers are rewarded without being right, fix the reward "
                       "(e.g. a format reward that pays for an empty answer)")
    return None


def truncation(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    t = _vals(h[-c.window:], "truncated_frac")
    if len(t) >= c.confirm_steps and _mean(t) > c.truncation_max:
        return Finding(f"{_mean(t):.0%} of completions hit rollout.max_new_tokens (mean of the last {len(t)} steps)",
                       "raise rollout.max_new_tokens, or shape it: algo.overlong_buffer / algo.mask_truncated=true")
    return None


@dataclass(frozen=True)
class Rule:
    check: Callable[[list[dict], MonitorConfig], Optional[Finding]]
    action_key: Optional[str] = None  # an entry of ACTIONS
    repeat: bool = False  # fire on every step it holds (default: once per run)


RULES: dict[str, Rule] = {
    "entropy_collapse": Rule(entropy_collapse, "raise_epsilon_high"),
    "advantage_collapse": Rule(advantage_collapse, "dynamic_sampling"),
    "echo_trap": Rule(echo_trap),
    "lazy_likelihood": Rule(lazy_likelihood),
    "gradient_explosion": Rule(grad_explosion, "rollback", repeat=True),  # every skipped step is reported
    "kl_blowup": Rule(kl_blowup),
    "stale_weights": Rule(stale_weights),
    "length_shortcut": Rule(length_shortcut),
    "truncation": Rule(truncation),
}


# --------------------------------------------------------------------------- the monitor


@dataclass
class Monitor:
    cfg: MonitorConfig = field(default_factory=MonitorConfig)
    history: list[dict] = field(default_factory=list)
    fired: list[dict] = field(default_factory=list)  # every alarm raised, as dicts (alarms.jsonl rows)
    rollbacks: int = 0

    def update(self, step: int, metrics: dict) -> list[Alarm]:
        self.history.append({**metrics, "step": step})
        new = []
        for name, rule in RULES.items():
            if name in self.cfg.disabled or (not rule.repeat and any(a["name"] == name for a in self.fired)):
                continue
            hit = rule.check(self.history, self.cfg)
            if hit is None:
                continue
            alarm = Alarm(name, step, hit.evidence, hit.action, hit.fatal, rule.action_key)
            self.fired.append(alarm.__dict__)  # the live dict: apply_action's `applied` shows up here too
            new.append(alarm)
        return new

    def state_dict(self) -> dict:
        return {"history": self.history, "fired": self.fired, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict) -> None:
        self.history, self.fired = list(state["history"]), [dict(a) for a in state["fired"]]
        self.rollbacks = state.get("rollbacks", 0)


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
