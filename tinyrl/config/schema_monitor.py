"""The run config's `monitor` section: every threshold, timing and auto-action switch of the
failure-mode monitor (tinyrl/monitor.py; the rules themselves: tinyrl/monitor_rules.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

from tinyrl.errors import ConfigError
from tinyrl.monitor_rules import RULES


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
    # entropy_collapse and echo_trap hold back while reward (window mean) is this x reward_max above its early mean:
    # learning, not collapse
    entropy_learning_rise: float = 0.15
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
    # rollout-vs-trainer k3 per token above this (from step 2) ... Engines that share the trainer's numerics (the hf
    # engine, vLLM-CPU in float32) sit at <= 1e-8; one update at a small lr on SmolLM2 reads 7e-4 on stale weights
    # (benchmarks/README.md, fifth pass): 1e-3 missed it. Engines with their own numerics (bf16 kernels) show
    # their noise at step 1 already, so the multiple below sets their limit.
    stale_k3: float = 1e-4
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
    # sandbox_gaming (code RL): completions that skip the tests rise while reward rises
    gaming_share_min: float = 0.3  # share (window) of completions with no code, an exit call or too much output ...
    gaming_rise: float = 0.2  # ... at least this far above its early-run share
    sandbox_gaming_steps: int = 1  # (the window mean is the noise guard)
    sandbox_gaming_cooldown: int = 50
    # truncation (a warning)
    truncation_max: float = 0.05  # window mean of truncated_frac above this
    truncation_steps: int = 2
    truncation_cooldown: int = 50
    # offpolicy_drift (partial rollouts; thresholds: tinyrl.monitor_rules.OFFPOLICY_*)
    offpolicy_drift_steps: int = 2
    offpolicy_drift_cooldown: int = 50

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
