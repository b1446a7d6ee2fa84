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

Where a rule compares a quantity with its own recent past and the quantity can sit near zero
(KL, clip fractions, grad norms, reward spread), it also needs an absolute floor: a ratio to a
tiny median is noise (an update KL of 0.02 against a median of 0.002 is a healthy step).
Thresholds are set from the metric traces of the healthy shipped presets with margin (see the
benchmark's headroom table). Metrics that were not measured are absent (or None): a rule whose
inputs are absent is silent, so the agent rules never fire on a single-turn run.

    rule                 severity  fires when
    entropy_collapse     alarm     entropy < 30% of its early value and < 0.5 nats, reward not high
    advantage_collapse   alarm     > 60% of groups have identical rewards (window mean), reward not high
    echo_trap            alarm     within-group reward std falls > 50% below its recent median
                                   (from >= 0.1) while the reward holds (neither high nor falling)
    lazy_likelihood      alarm     the update lowers most positive responses' likelihood (and their
                                   mean by > 0.01 nats/token), or it falls for 3 windows while reward rises
    gradient_explosion   alarm     grad norm > 5x its rolling median and > 5; or a skipped
                                   non-finite step (every one is reported)
    kl_blowup            alarm     KL to the reference accelerates (beta > 0); or the update KL /
                                   update clip fraction is far above its median and an absolute floor;
                                   or the update KL is above 0.5 nats per token
    stale_weights        alarm     rollout vs trainer logprobs disagree after a weight sync (fatal)
    length_shortcut      alarm     completion length falls > 50% (and >= 4 tokens) while reward rises
    length_explosion     alarm     the share of completions hitting max_new_tokens grows past 50%
                                   from < 20% early, with the completion length
    tool_use_collapse    alarm     tool calls per trajectory fall below 10% of their peak (>= 0.5)
    tool_loop            alarm     > 90% of trajectories end at agent.max_turns, or tool output is
                                   > 80% of the completion tokens (window means)
    tool_errors          alarm     > 50% of tool calls fail (window mean), at >= 0.2 calls per trajectory
    truncation           warning   > 5% of completions hit max_new_tokens (window mean)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from typing import Callable, Literal, NamedTuple, Optional

from tinyrl.errors import ConfigError

log = logging.getLogger("tinyrl.monitor")

Severity = Literal["alarm", "warning"]


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
    zero_std_max: float = 0.6  # window mean of zero_std_frac above this
    advantage_collapse_steps: int = 1  # (the window mean is the noise guard)
    advantage_collapse_cooldown: int = 50
    # echo_trap: the within-group spread falls on its own
    echo_drop: float = 0.5  # group reward std (window median) falls by more than this fraction ...
    echo_min_std: float = 0.1  # ... from a window median of at least this
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
    update_kl_max: float = 0.5  # or: update_kl above this whatever its median (one step moved the policy far)
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
    length_drop_min: float = 4.0  # ... and by at least this many tokens
    length_shortcut_steps: int = 1
    length_shortcut_cooldown: int = 50
    # length_explosion: completions grow into the length cap
    length_explosion_trunc: float = 0.5  # window mean of truncated_frac above this ...
    length_explosion_base: float = 0.2  # ... from an early-run truncated_frac below this
    length_explosion_steps: int = 2
    length_explosion_cooldown: int = 50
    # tool_use_collapse (multi-turn): the agent stops calling its tools
    tool_used_min: float = 0.5  # "tools were used": a window mean of tool_calls_per_traj reached this ...
    tool_collapse_frac: float = 0.1  # ... and the latest window mean fell below this fraction of its peak
    tool_use_collapse_steps: int = 2
    tool_use_collapse_cooldown: int = 50
    # tool_loop (multi-turn): the agent calls tools instead of answering
    max_turns_pin: float = 0.9  # window mean of max_turns_frac above this ...
    obs_flood_frac: float = 0.8  # ... or of obs_token_frac (tool output / completion tokens) above this
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


def _window_mean(h: list[dict], key: str, n: int) -> Optional[float]:
    """Mean of `key` over the last n rows, or None unless all n have it (absent: not measured)."""
    xs = _vals(h[-n:], key)
    return _mean(xs) if len(xs) == n else None


def _reward_high(rows: list[dict], c: MonitorConfig) -> tuple[bool, float]:
    r = _mean(_vals(rows, "reward_mean"))
    return (not math.isnan(r) and r >= c.reward_high_frac * c.reward_max), r


def _spike(h: list[dict], key: str, factor: float, floor: float, c: MonitorConfig) -> Optional[tuple[float, float]]:
    """(latest, rolling median) when the latest value is > factor x its rolling median and > floor.
    Steps that took no optimiser step (skipped_no_signal) are left out of the median."""
    past = _vals([r for r in h[-c.median_window - 1:-1] if not r.get("skipped_no_signal")], key)
    x = h[-1].get(key)
    if not _finite(x) or len(past) < c.window:
        return None
    med = _median(past)
    return (x, med) if x > floor and x > factor * med else None


# --------------------------------------------------------------------------- rules


def entropy_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """The policy narrows onto one answer before it has learned the task: token entropy below a
    fraction of its early-run value *and* below an absolute level, while reward is not high (a
    solved task may be confident)."""
    if len(h) <= c.baseline_steps:
        return None
    base, e = _mean(_vals(h[: c.baseline_steps], "entropy")), h[-1].get("entropy")
    high, r = _reward_high(h[-c.entropy_collapse_steps:], c)
    if not (base > 0 and _finite(e)) or high:
        return None
    if e < c.entropy_collapse_frac * base and e < c.entropy_collapse_abs:
        return Finding(f"mean token entropy {e:.3g} is {e / base:.0%} of its early-run value {base:.3g} while "
                       f"reward is {r:.3f} (< {c.reward_high_frac:g} x {c.reward_max:g})",
                       "clip-higher (algo.epsilon_high=0.28, with algo.num_iterations>=2), a top-entropy token "
                       "mask (algo.top_entropy_quantile=0.2), or a lower train.lr")
    return None


def advantage_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Most groups answer all alike (zero reward spread: zero advantage) over a window while the
    task is not solved, so the run has nothing to learn from. (All solved is not a failure.)"""
    z = _window_mean(h, "zero_std_frac", c.window)
    high, r = _reward_high(h[-c.window:], c)
    if z is None or z <= c.zero_std_max or high:
        return None
    return Finding(f"{z:.0%} of groups had identical rewards (zero advantage) over the last {c.window} steps "
                   f"while reward is {r:.3f}: no signal to learn from",
                   "turn on dynamic sampling (algo.dynamic_sampling=true), raise rollout.num_generations, or use "
                   "an easier curriculum")


def echo_trap(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Each group's samples come to echo one answer: the within-group reward spread (window
    median, so a few unlucky batches of a sparse reward do not count) falls far below its median
    just before, from a real spread, while reward holds. Fewer successes (reward falling too) is
    advantage collapse, not echo; a solved task may agree with itself."""
    if len(h) < 2 * c.window:
        return None
    ref, now = h[-2 * c.window:-c.window], h[-c.window:]
    s_ref, s_now = _vals(ref, "reward_group_std"), _vals(now, "reward_group_std")
    high, _ = _reward_high(now[-c.echo_trap_steps:], c)
    r_ref, r_now = _mean(_vals(ref, "reward_mean")), _mean(_vals(now, "reward_mean"))
    if len(s_ref) < c.window or len(s_now) < c.window or high or not r_now >= (1 - c.echo_drop) * r_ref:
        return None
    med, cur = _median(s_ref), _median(s_now)
    if med >= c.echo_min_std and cur < (1 - c.echo_drop) * med:
        return Finding(f"within-group reward std (median of the last {c.window} steps) {cur:.3g} fell "
                       f"{1 - cur / med:.0%} below its median {med:.3g} just before, while reward holds at "
                       f"{r_now:.3f}: each group's samples echo one answer",
                       "raise rollout.temperature, turn on algo.dynamic_sampling, or lower train.lr")
    return None


def lazy_likelihood(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Lazy likelihood displacement: the update lowers the likelihood of most of the responses it
    rewards, and lowers it on average by more than noise (means over a few steps: an overshooting
    step size shows here first; on a healthy run about half of them can dip while the mean
    rises), or correct responses' likelihood keeps falling for several windows (by more than noise) while reward rises."""
    action = "turn on LLDS: algo.llds_lambda=0.2 with algo.num_iterations>=2"
    nonpos = _window_mean(h, "frac_pos_delta_nonpos", c.lld_nonpos_steps)
    delta = _window_mean(h, "logp_pos_delta", c.lld_nonpos_steps)
    if nonpos is not None and delta is not None and nonpos > c.lld_nonpos_frac and delta < -c.lld_delta_floor:
        return Finding(f"the update lowered the likelihood of {nonpos:.0%} of the positive-advantage responses it "
                       f"was meant to reinforce, by {-delta:.3g} nats per token on average (mean over the last "
                       f"{c.lld_nonpos_steps} steps)",
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
    if all(b < a for a, b in zip(lp, lp[1:])) and lp[0] - lp[-1] >= c.lld_fall_min and rw[-1] > rw[0] + c.reward_rise:
        return Finding(f"log-likelihood per token of correct responses fell for {c.lld_windows} windows of "
                       f"{c.window} steps ({lp[0]:.3f} -> {lp[-1]:.3f}) while reward rose ({rw[0]:.3f} -> {rw[-1]:.3f})",
                       action)
    return None


def grad_explosion(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """A gradient spike: the pre-clip grad norm far above its rolling median and above an
    absolute floor; or a step whose loss or gradient was not finite (skipped by the trainer)."""
    last = h[-1]
    if last.get("skipped_nonfinite"):
        return Finding(f"non-finite loss or gradient at step {last['step']}; the step was skipped (weights untouched)",
                       "lower train.lr, raise train.max_grad_norm headroom, or check the reward scale")
    hit = _spike(h, "grad_norm", c.grad_explosion_factor, c.grad_explosion_floor, c)
    if hit:
        g, med = hit
        return Finding(f"grad norm {g:.3g} is {g / med if med > 0 else math.inf:.1f}x its rolling median {med:.3g} "
                       f"(floor {c.grad_explosion_floor:g})",
                       "lower train.lr or train.max_grad_norm; check for a reward outlier")
    return None


def kl_blowup(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """The policy runs away: KL to the reference (beta > 0) above a floor and growing faster than
    linearly; or the update itself moves it far: the post-update KL(pi_old || pi_new)
    (`update_kl`) or the share of tokens the update pushed past the clip range, each far above
    its rolling median *and* above an absolute floor, or the update KL above a ceiling no healthy
    step reaches (the first steps of a run have no median to compare with)."""
    action = "lower train.lr, raise algo.beta, or tighten algo.epsilon_low/epsilon_high"
    kl = _vals(h, "ref_kl")
    if len(kl) >= 3 * c.window and kl[-1] > c.kl_floor:  # the first window is warm-up (KL starts ~quadratic)
        old, new = _slope(kl[-2 * c.window:-c.window]), _slope(kl[-c.window:])
        if new > c.kl_accel_factor * max(old, c.kl_floor / c.window):
            return Finding(f"KL to the reference {kl[-1]:.3g} is accelerating: slope {new:.3g}/step over the last "
                           f"{c.window} steps vs {old:.3g}/step before (> {c.kl_accel_factor:g}x)", action)
    checks = (("update_kl", c.update_kl_factor, c.update_kl_floor),
              ("update_clip_frac", c.clip_frac_factor, c.clip_frac_floor))
    x = h[-1].get("update_kl")
    if _finite(x) and x > c.update_kl_max:
        return Finding(f"update_kl {x:.3g} per token is above {c.update_kl_max:g}: one update moved the policy far "
                       "from the one that sampled the batch", action)
    for key, factor, floor in checks:
        hit = _spike(h, key, factor, floor, c)
        if hit:
            return Finding(f"{key} {hit[0]:.3g} is above {floor:g} and {factor:g}x its rolling median {hit[1]:.3g}",
                           action)
    return None


def stale_weights(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """The canary: the rollout engine's logprobs disagree with the trainer's right after a weight
    sync. Every row from step 2 on is measured on rollouts sampled after the previous step's sync;
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
    """A length shortcut: completions get much shorter (relative and in tokens) while reward
    rises, as when a format reward pays for an empty answer."""
    if len(h) < c.baseline_steps + c.window:
        return None
    base_len, cur_len = _mean(_vals(h[: c.baseline_steps], "completion_len")), _mean(_vals(h[-c.window:], "completion_len"))
    base_r, cur_r = _mean(_vals(h[: c.baseline_steps], "reward_mean")), _mean(_vals(h[-c.window:], "reward_mean"))
    if (base_len > 0 and cur_len < (1 - c.length_drop) * base_len and base_len - cur_len >= c.length_drop_min
            and cur_r > base_r + c.reward_rise):
        return Finding(f"completion length fell {1 - cur_len / base_len:.0%} ({base_len:.1f} -> {cur_len:.1f} tokens) "
                       f"while reward rose ({base_r:.3f} -> {cur_r:.3f})",
                       "read samples.jsonl: if short answers are rewarded without being right, fix the reward "
                       "(e.g. a format reward that pays for an empty answer)")
    return None


def length_explosion(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Completions grow into the length cap: most of them now hit max_new_tokens where few did
    early in the run, and the mean completion length grew with it. (A cap that is tight from the
    start is the truncation warning, not this.)"""
    if len(h) < c.baseline_steps + c.window:
        return None
    t_base, t_now = _mean(_vals(h[: c.baseline_steps], "truncated_frac")), _window_mean(h, "truncated_frac", c.window)
    l_base, l_now = _mean(_vals(h[: c.baseline_steps], "completion_len")), _window_mean(h, "completion_len", c.window)
    if t_now is None or l_now is None or math.isnan(t_base) or not l_now > l_base:
        return None
    if t_base < c.length_explosion_base and t_now > c.length_explosion_trunc:
        return Finding(f"{t_now:.0%} of completions hit rollout.max_new_tokens (mean of the last {c.window} steps) "
                       f"where {t_base:.0%} did early on; length {l_base:.1f} -> {l_now:.1f} tokens",
                       "read samples.jsonl (a repetition loop? a reward that pays for length?); shape it with "
                       "algo.overlong_buffer or algo.mask_truncated=true, or lower train.lr")
    return None


def tool_use_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Multi-turn runs: the agent stops calling tools after it had been using them (the window
    mean of tool_calls_per_traj falls to a small fraction of its peak window mean), e.g. because
    tool observations only ever hurt its reward or answering directly is paid as well. Silent
    when the agent metrics are absent, and for a task whose agent never used tools."""
    calls = _vals(h, "tool_calls_per_traj")
    if len(calls) < 2 * c.window or _window_mean(h, "tool_calls_per_traj", c.window) is None:
        return None
    peak = max(_mean(calls[i:i + c.window]) for i in range(len(calls) - c.window + 1))
    now = _mean(calls[-c.window:])
    if peak >= c.tool_used_min and now < c.tool_collapse_frac * peak:
        obs = _window_mean(h, "obs_token_frac", c.window)
        seen = f"; tool output is {obs:.0%} of the completion tokens" if obs is not None else ""
        return Finding(f"tool calls per trajectory fell to {now:.3g} (mean of the last {c.window} steps) from a "
                       f"peak of {peak:.3g}: the agent stopped using its tools{seen}",
                       "read samples.jsonl: check the tool observations (errors? empty?); lower train.lr; reward "
                       "answers that need the tool (a task the model answers without it teaches it to skip it)")
    return None


def tool_loop(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Multi-turn runs: the agent calls tools instead of answering: most trajectories end at
    agent.max_turns (window mean of max_turns_frac), or tool output floods the completions
    (window mean of obs_token_frac, observation tokens over completion tokens). Silent when the
    agent metrics are absent."""
    pin = _window_mean(h, "max_turns_frac", c.window)
    if pin is not None and pin > c.max_turns_pin:
        return Finding(f"{pin:.0%} of trajectories used all agent.max_turns (mean of the last {c.window} steps): "
                       "the agent does not finish",
                       "read samples.jsonl: check the answer format the task expects and the stop condition; "
                       "raise agent.max_turns if the task needs more turns")
    obs = _window_mean(h, "obs_token_frac", c.window)
    if obs is not None and obs > c.obs_flood_frac:
        return Finding(f"tool output is {obs:.0%} of the completion tokens (mean of the last {c.window} steps): the "
                       "agent calls tools instead of answering",
                       "lower agent.max_obs_tokens or agent.max_turns; read samples.jsonl for repeated calls")
    return None


def tool_errors(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Multi-turn runs: most tool calls fail (malformed calls or tool exceptions) over a window,
    while the agent does call tools (a single failed call in a batch that hardly calls any is
    not a trend). Silent when tool_error_rate is absent."""
    e = _window_mean(h, "tool_error_rate", c.window)
    calls = _window_mean(h, "tool_calls_per_traj", c.window)
    if e is not None and e > c.tool_error_max and (calls is None or calls >= c.tool_error_min_calls):
        per = f" at {calls:.2g} calls per trajectory" if calls is not None else ""
        return Finding(f"{e:.0%} of tool calls failed (mean of the last {c.window} steps){per}",
                       "read samples.jsonl: check the tool-call format in the prompt and the tool's errors")
    return None


def truncation(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """A notice (warning): a share of completions hits max_new_tokens; their answers are cut."""
    t = _window_mean(h, "truncated_frac", min(c.window, len(h)))
    if t is not None and t > c.truncation_max:
        return Finding(f"{t:.0%} of completions hit rollout.max_new_tokens (mean of the last {min(c.window, len(h))} "
                       "steps)", "raise rollout.max_new_tokens, or shape it: algo.overlong_buffer / algo.mask_truncated=true")
    return None


@dataclass(frozen=True)
class Rule:
    check: Callable[[list[dict], MonitorConfig], Optional[Finding]]
    action_key: Optional[str] = None  # an entry of ACTIONS
    severity: Severity = "alarm"


RULES: dict[str, Rule] = {
    "entropy_collapse": Rule(entropy_collapse, "raise_epsilon_high"),
    "advantage_collapse": Rule(advantage_collapse, "dynamic_sampling"),
    "echo_trap": Rule(echo_trap),
    "lazy_likelihood": Rule(lazy_likelihood),
    "gradient_explosion": Rule(grad_explosion, "rollback"),
    "kl_blowup": Rule(kl_blowup),
    "stale_weights": Rule(stale_weights),
    "length_shortcut": Rule(length_shortcut),
    "length_explosion": Rule(length_explosion),
    "tool_use_collapse": Rule(tool_use_collapse),
    "tool_loop": Rule(tool_loop),
    "tool_errors": Rule(tool_errors),
    "truncation": Rule(truncation, severity="warning"),
}


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
