"""The failure-mode rules the monitor runs (`RULES`): each a condition on the metric history.

A rule is `check(history, cfg) -> Finding | None` over the metrics rows up to this step, plus
its auto-action key and severity; the timing (minimum duration, cool-down) is the monitor's
(`tinyrl.monitor`), the thresholds are `MonitorConfig` fields.

Where a rule compares a quantity with its own recent past and the quantity can sit near zero
(KL, clip fractions, grad norms, reward spread), it also needs an absolute floor: a ratio to a
tiny median is noise (an update KL of 0.02 against a median of 0.002 is a healthy step).
Thresholds are set from the metric traces of the healthy shipped presets with margin (see the
benchmark's headroom table). Metrics that were not measured are absent (or None): a rule whose
inputs are absent is silent, so the agent rules never fire on a single-turn run.

    rule                 severity  fires when
    entropy_collapse     alarm     entropy < 30% of its early value and < 0.5 nats, reward neither high
                                   nor 0.15 above its early-run mean (that is learning)
    advantage_collapse   alarm     > 90% of groups have identical rewards (window mean), reward not high
    echo_trap            alarm     within-group reward std falls > 50% below its recent median
                                   (from >= 0.1) and entropy > 20%, while the reward holds (neither
                                   high nor falling)
    lazy_likelihood      alarm     the update lowers most positive responses' likelihood (and their
                                   mean by > 0.01 nats/token), or it falls for 3 windows while reward rises
    gradient_explosion   alarm     grad norm > 5x its rolling median and > 5; or a skipped
                                   non-finite step (every one is reported)
    kl_blowup            alarm     KL to the reference accelerates (beta > 0); or the update KL /
                                   update clip fraction is far above its median and an absolute floor;
                                   or the update KL is above 0.2 nats per token
    stale_weights        alarm     rollout vs trainer logprobs disagree after a weight sync (fatal); on a step
                                   that trained on tokens of older weights (staleness_max > 0) only the current
                                   adapter's tokens count (rollout_trainer_k3_fresh), silent when there are none
    length_shortcut      alarm     completion length falls > 50% (and >= 4 tokens, or to <= 1.5) while
                                   reward rises
    length_explosion     alarm     > 40% of a step's completions hit max_new_tokens (< 20% early) and
                                   the mean length is > 25% above its early value, two steps running
    tool_use_collapse    alarm     tool calls per trajectory fall below 10% of their peak (>= 0.5)
    tool_loop            alarm     > 90% of trajectories end at agent.max_turns (window mean)
    tool_errors          alarm     > 50% of tool calls fail (window mean), at >= 0.2 calls per trajectory
    sandbox_gaming       alarm     code RL: the share of completions with no code block, an exit call
                                   (sys.exit, os._exit, exit(), SystemExit) or too much output rises
                                   by >= 0.2 (to >= 0.3, window mean) while reward rises
    truncation           warning   > 5% of completions hit max_new_tokens (window mean)

    offpolicy_drift      alarm     partial rollouts: the behaviour weights' effective sample size below 0.5,
                                   or > 25% of the groups dropped as too stale (window means); thresholds are
                                   the OFFPOLICY_* constants
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, NamedTuple, Optional

from tinyrl.monitor_history import finite, mean, median, reward_high, slope, spike, vals, window_mean

if TYPE_CHECKING:  # the config imports nothing from here at run time (no cycle)
    from tinyrl.config.schema_monitor import MonitorConfig

Severity = Literal["alarm", "warning"]


class Finding(NamedTuple):
    evidence: str
    action: str
    fatal: bool = False


# --------------------------------------------------------------------------- rules


def entropy_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """The policy narrows onto one answer before it has learned the task: token entropy below a
    fraction of its early-run value *and* below an absolute level, while reward is not high (a
    solved task may be confident) and has not clearly risen.

    Entropy falling while reward rises is learning, not collapse: a policy that learns grows sure of
    what it gets right. So the alarm holds back while reward (mean of the last `window` steps) is at
    least `entropy_learning_rise` x reward_max above its early-run mean; once the gain is gone the
    level test decides again. On the traces this was set from (benchmarks/README.md): healthy
    SmolLM2-135M GRPO (seeds 0, 1) falls from ~1.1 to 0.13-0.25 nats per token (12-30% of its early
    value) while its reward climbs ~0.25 -> 0.7-0.8, a rise of 0.18-0.57 on every step where the
    level test holds; the tiny model driven to collapse (tiny_entropy_collapse_cpu) rises at most
    0.11 by chance. The threshold, 0.15, sits between the two. A bare "reward rises" test would not
    do: that chance rise is above the 0.05 that `reward_rise` uses.
    Nor did the certainty split (entropy of the worse- vs better-than-group samples, shown in the
    evidence): healthy SmolLM2 sits at 1.2-2.6x, the collapse at 1.2-1.4x, too close at 4 prompts a
    step to tell apart."""
    if len(h) <= c.baseline_steps:
        return None
    base, e = mean(vals(h[: c.baseline_steps], "entropy")), h[-1].get("entropy")
    high, r = reward_high(h[-c.entropy_collapse_steps:], c)
    if not (base > 0 and finite(e)) or high:
        return None
    if not (e < c.entropy_collapse_frac * base and e < c.entropy_collapse_abs):
        return None
    if _learning(h, c):
        return None
    return Finding(f"mean token entropy {e:.3g} is {e / base:.0%} of its early-run value {base:.3g} while "
                   f"reward is {r:.3f} (< {c.reward_high_frac:g} x {c.reward_max:g}){_certainty(h, c)}",
                   "clip-higher (algo.epsilon_high=0.28, with algo.num_iterations>=2), a top-entropy token "
                   "mask (algo.top_entropy_quantile=0.2), or a lower train.lr")


def _entropy_split(h: list[dict], c: MonitorConfig) -> Optional[tuple[float, float]]:
    """(entropy of the worse-than-group-mean samples, of the better ones), window means; None unmeasured."""
    rows = h[-c.window:]
    neg, pos = vals(rows, "entropy_adv_neg"), vals(rows, "entropy_adv_pos")
    return (mean(neg), mean(pos)) if neg and pos else None


def _learning(h: list[dict], c: MonitorConfig) -> bool:
    """Reward (window mean) clearly above its early-run mean."""
    early, recent = mean(vals(h[: c.baseline_steps], "reward_mean")), window_mean(h, "reward_mean", c.window)
    return recent is not None and not math.isnan(early) and recent >= early + c.entropy_learning_rise * c.reward_max


def _certainty(h: list[dict], c: MonitorConfig) -> str:
    split = _entropy_split(h, c)
    return "" if split is None else f"; wrong samples {split[0]:.3g} vs right samples {split[1]:.3g} nats per token"


def advantage_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Nearly every group answers all alike (zero reward spread: zero advantage) over a window
    while the task is not solved, so the run has next to nothing to learn from. (All solved is
    not a failure; nor is a sparse reward: at 8% success a group of 8 is all-zero half the time,
    and the search agent learns with 50-80% of its groups all-zero.)"""
    z = window_mean(h, "zero_std_frac", c.window)
    high, r = reward_high(h[-c.window:], c)
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
    advantage collapse, not echo; a solved task may agree with itself. Samples that echo one
    answer are less diverse, so token entropy falls with the spread: a sparse reward's spread
    halves by chance over 5 steps while entropy holds (the search agent's healthy runs).

    Nor is a run that learns an echo: as prompts get solved their groups answer all right (spread 0),
    and the sharper policy's entropy falls, while reward climbs. So, as `entropy_collapse`, the alarm
    holds back while reward is `entropy_learning_rise` x reward_max above its early-run mean: healthy
    SmolLM2-135M GRPO seed 2 (reward 0.25 -> 0.6-0.9) met the spread and entropy tests at step 25,
    its reward 0.36 above the early mean; `default_learning.py`'s seed 1 had raised it the same way."""
    if len(h) < 2 * c.window:
        return None
    ref, now = h[-2 * c.window:-c.window], h[-c.window:]
    s_ref, s_now = vals(ref, "reward_group_std"), vals(now, "reward_group_std")
    high, _ = reward_high(now[-c.echo_trap_steps:], c)
    r_ref, r_now = mean(vals(ref, "reward_mean")), mean(vals(now, "reward_mean"))
    if len(s_ref) < c.window or len(s_now) < c.window or high or not r_now >= (1 - c.echo_drop) * r_ref:
        return None
    if _learning(h, c):
        return None
    med, cur = median(s_ref), median(s_now)
    e_ref, e_now = mean(vals(ref, "entropy")), mean(vals(now, "entropy"))
    narrower = not (e_ref > 0) or e_now < (1 - c.echo_entropy_drop) * e_ref  # entropy not measured: spread alone
    if med >= c.echo_min_std and cur < (1 - c.echo_drop) * med and narrower:
        return Finding(f"within-group reward std (median of the last {c.window} steps) {cur:.3g} fell "
                       f"{1 - cur / med:.0%} below its median {med:.3g} just before, and token entropy "
                       f"{e_now:.3g} {1 - e_now / e_ref:.0%} below its {e_ref:.3g}, while reward holds at "
                       f"{r_now:.3f}: each group's samples echo one answer",
                       "raise rollout.temperature, turn on algo.dynamic_sampling, or lower train.lr")
    return None


def lazy_likelihood(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Lazy likelihood displacement: the update lowers the likelihood of most of the responses it
    rewards, and lowers it on average by more than noise (means over a few steps: an overshooting
    step size shows here first; on a healthy run about half of them can dip while the mean
    rises), or correct responses' likelihood keeps falling for several windows (by more than
    noise) while reward rises and the updates themselves did not raise it on average."""
    action = "turn on LLDS: algo.llds_lambda=0.2 with algo.num_iterations>=2"
    nonpos = window_mean(h, "frac_pos_delta_nonpos", c.lld_nonpos_steps)
    delta = window_mean(h, "logp_pos_delta", c.lld_nonpos_steps)
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
    lp = [mean(vals(ch, "logp_pos_mean")) for ch in chunks]
    rw = [mean(vals(ch, "reward_mean")) for ch in chunks]
    if any(math.isnan(x) for x in lp + rw):
        return None
    # across steps the correct responses are different ones (an agent that learns to search answers
    # with other text): where the update's own effect on them was measured and was a rise, a fall
    # across steps is a change of which responses are correct, not a displacement
    own = vals(h[-n:], "logp_pos_delta")
    if own and mean(own) > 0:
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
    hit = spike(h, "grad_norm", c.grad_explosion_factor, c.grad_explosion_floor, c)
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
    kl = vals(h, "ref_kl")
    if len(kl) >= 3 * c.window and kl[-1] > c.kl_floor:  # the first window is warm-up (KL starts ~quadratic)
        old, new = slope(kl[-2 * c.window:-c.window]), slope(kl[-c.window:])
        if new > c.kl_accel_factor * max(old, c.kl_floor / c.window):
            return Finding(f"KL to the reference {kl[-1]:.3g} is accelerating: slope {new:.3g}/step over the last "
                           f"{c.window} steps vs {old:.3g}/step before (> {c.kl_accel_factor:g}x)", action)
    checks = (("update_kl", c.update_kl_factor, c.update_kl_floor),
              ("update_clip_frac", c.clip_frac_factor, c.clip_frac_floor))
    x = h[-1].get("update_kl")
    if finite(x) and x > c.update_kl_max:
        return Finding(f"update_kl {x:.3g} per token is above {c.update_kl_max:g}: one update moved the policy far "
                       "from the one that sampled the batch", action)
    for key, factor, floor in checks:
        hit = spike(h, key, factor, floor, c)
        if hit:
            return Finding(f"{key} {hit[0]:.3g} is above {floor:g} and {factor:g}x its rolling median {hit[1]:.3g}",
                           action)
    return None


def stale_weights(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """The canary: the rollout engine's logprobs disagree with the trainer's right after a weight
    sync. Every row from step 2 on is measured on rollouts sampled after the previous step's sync;
    step 1 samples from the initial weights both sides share, so its mismatch is the noise floor. The limit is the
    larger of an absolute one (monitor.stale_k3, 1e-4: above what an engine with the trainer's numerics ever
    reads, under what one small update on stale weights does) and 10x that floor (an engine with its own
    numerics, bf16 kernels, shows them at step 1 already)."""
    last = h[-1]
    k3, md = last.get("rollout_trainer_k3"), last.get("rollout_trainer_maxdiff")
    if last.get("step", 0) < 2 or not finite(k3):
        return None
    if finite(last.get("staleness_max")) and last["staleness_max"] > 0:  # older weights sampled some on purpose
        k3, md = last.get("rollout_trainer_k3_fresh"), None  # (partial rollouts): judge the current adapter's tokens
        if not finite(k3):  # none (one-step-off: every token is a version old): offpolicy_drift's to judge
            return None
    floor = next((r.get("rollout_trainer_k3") for r in h if r.get("step") == 1), None)
    limit = max(c.stale_k3, c.stale_noise_factor * floor if finite(floor) else 0.0)
    over_md = c.stale_maxdiff is not None and finite(md) and md > c.stale_maxdiff
    if k3 > limit or over_md:
        return Finding(f"rollout-engine vs trainer logprobs disagree right after a weight sync: k3 {k3:.3g}/token "
                       f"(limit {limit:.3g}), max |diff| {md if md is not None else float('nan'):.3g}; the engine "
                       "is not sampling from the trained weights",
                       "check that engine.sync(model) pushes the LoRA adapter (vLLM: the adapter is reloaded, "
                       "not cached); set monitor.stale_fatal=false to only warn", c.stale_fatal)
    return None


def length_shortcut(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """A length shortcut: completions get much shorter (relative, and in tokens or down to next
    to nothing) while reward rises, as when a format reward pays for an empty answer. A short
    answer (a bare sum of 3 tokens) cannot lose 4 tokens, but it can shrink to its end-of-text
    token alone."""
    if len(h) < c.baseline_steps + c.window:
        return None
    base_len, cur_len = mean(vals(h[: c.baseline_steps], "completion_len")), mean(vals(h[-c.window:], "completion_len"))
    base_r, cur_r = mean(vals(h[: c.baseline_steps], "reward_mean")), mean(vals(h[-c.window:], "reward_mean"))
    far = base_len - cur_len >= c.length_drop_min or cur_len <= c.length_empty_max  # a short answer can only empty
    if base_len > 0 and cur_len < (1 - c.length_drop) * base_len and far and cur_r > base_r + c.reward_rise:
        return Finding(f"completion length fell {1 - cur_len / base_len:.0%} ({base_len:.1f} -> {cur_len:.1f} tokens) "
                       f"while reward rose ({base_r:.3f} -> {cur_r:.3f})",
                       "read samples.jsonl: if short answers are rewarded without being right, fix the reward "
                       "(e.g. a format reward that pays for an empty answer)")
    return None


def length_explosion(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Completions grow into the length cap: a large share of this step's completions hit
    max_new_tokens where few did early in the run, and the mean completion length grew well
    above its early value. Read per step (the duration, `length_explosion_steps`, is the noise
    guard), so it fires while the growth is under way, before nearly every completion is cut. A
    cap that is tight from the start is the truncation warning, not this."""
    if len(h) <= c.baseline_steps:
        return None
    t_base, t_now = mean(vals(h[: c.baseline_steps], "truncated_frac")), h[-1].get("truncated_frac")
    l_base, l_now = mean(vals(h[: c.baseline_steps], "completion_len")), h[-1].get("completion_len")
    if not (finite(t_now) and finite(l_now)) or math.isnan(t_base) or not l_base > 0:
        return None
    if (t_base < c.length_explosion_base and t_now > c.length_explosion_trunc
            and l_now > (1 + c.length_explosion_growth) * l_base):
        return Finding(f"{t_now:.0%} of completions hit rollout.max_new_tokens where {t_base:.0%} did early on; "
                       f"mean length {l_base:.1f} -> {l_now:.1f} tokens",
                       "read samples.jsonl (a repetition loop? a reward that pays for length?); shape it with "
                       "algo.overlong_buffer or algo.mask_truncated=true, or lower train.lr")
    return None


def tool_use_collapse(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Multi-turn runs: the agent stops calling tools after it had been using them (the window
    mean of tool_calls_per_traj falls to a small fraction of its peak window mean), e.g. because
    tool observations only ever hurt its reward or answering directly is paid as well. Silent
    when the agent metrics are absent, and for a task whose agent never used tools."""
    calls = vals(h, "tool_calls_per_traj")
    if len(calls) < 2 * c.window or window_mean(h, "tool_calls_per_traj", c.window) is None:
        return None
    peak = max(mean(calls[i:i + c.window]) for i in range(len(calls) - c.window + 1))
    now = mean(calls[-c.window:])
    if peak >= c.tool_used_min and now < c.tool_collapse_frac * peak:
        obs = window_mean(h, "obs_token_frac", c.window)
        seen = f"; tool output is {obs:.0%} of the completion tokens" if obs is not None else ""
        return Finding(f"tool calls per trajectory fell to {now:.3g} (mean of the last {c.window} steps) from a "
                       f"peak of {peak:.3g}: the agent stopped using its tools{seen}",
                       "read samples.jsonl: check the tool observations (errors? empty?); lower train.lr; reward "
                       "answers that need the tool (a task the model answers without it teaches it to skip it)")
    return None


def tool_loop(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Multi-turn runs: the agent calls tools instead of answering: most trajectories end at
    agent.max_turns (window mean of max_turns_frac). Not the share of tool output in the
    completions: a search agent that reads two passages per call is 85-92% observation tokens
    when healthy. Silent when the agent metrics are absent."""
    pin = window_mean(h, "max_turns_frac", c.window)
    if pin is not None and pin > c.max_turns_pin:
        return Finding(f"{pin:.0%} of trajectories used all agent.max_turns (mean of the last {c.window} steps): "
                       "the agent does not finish",
                       "read samples.jsonl: check the answer format the task expects and the stop condition; "
                       "raise agent.max_turns if the task needs more turns")
    return None


def tool_errors(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Multi-turn runs: most tool calls fail (malformed calls or tool exceptions) over a window,
    while the agent does call tools (a single failed call in a batch that hardly calls any is
    not a trend). Silent when tool_error_rate is absent."""
    e = window_mean(h, "tool_error_rate", c.window)
    calls = window_mean(h, "tool_calls_per_traj", c.window)
    if e is not None and e > c.tool_error_max and (calls is None or calls >= c.tool_error_min_calls):
        per = f" at {calls:.2g} calls per trajectory" if calls is not None else ""
        return Finding(f"{e:.0%} of tool calls failed (mean of the last {c.window} steps){per}",
                       "read samples.jsonl: check the tool-call format in the prompt and the tool's errors")
    return None


SANDBOX_RUNS = ("pass", "fail", "timeout", "crash", "output_limit", "no_code", "error")  # tinyrl.rewards.code.OUTCOMES
SANDBOX_GAMED = ("no_code", "exit_call", "output_limit")


def _gamed_share(rows: list[dict]) -> Optional[tuple[float, dict[str, float]]]:
    """(share of completions that look gamed, share per kind) over `rows`' sandbox counts; None without them."""
    runs = sum(sum(vals(rows, f"sandbox/{k}")) for k in SANDBOX_RUNS)
    if not runs:
        return None
    kinds = {k: sum(vals(rows, f"sandbox/{k}")) / runs for k in SANDBOX_GAMED}
    return min(1.0, sum(kinds.values())), kinds


def sandbox_gaming(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Code RL: the policy learns to game the sandbox instead of passing its tests: the share of
    completions with no code block, with an exit call (sys.exit / os._exit / exit() / SystemExit:
    leaving before the checks) or over the output limit rises well above its early value while
    reward rises (a reward that pays for those, e.g. a format or partial-credit term). Silent
    where no sandbox ran (no sandbox/* counts in the metrics)."""
    if len(h) < c.baseline_steps + c.window:
        return None
    base, cur = _gamed_share(h[: c.baseline_steps]), _gamed_share(h[-c.window:])
    if base is None or cur is None:
        return None
    base_r, cur_r = mean(vals(h[: c.baseline_steps], "reward_mean")), mean(vals(h[-c.window:], "reward_mean"))
    if cur[0] >= c.gaming_share_min and cur[0] - base[0] >= c.gaming_rise and cur_r > base_r + c.reward_rise:
        kinds = ", ".join(f"{k} {v:.0%}" for k, v in cur[1].items() if v)
        return Finding(f"{cur[0]:.0%} of completions game the sandbox ({kinds}; {base[0]:.0%} early on) while "
                       f"reward rose ({base_r:.3f} -> {cur_r:.3f})",
                       "read samples.jsonl: a reward term pays for code that does not pass the tests (drop or "
                       "lower a format reward, use the task's reward: all_pass); the sandbox itself scores these 0")
    return None


def truncation(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """A notice (warning): a share of completions hits max_new_tokens; their answers are cut."""
    t = window_mean(h, "truncated_frac", min(c.window, len(h)))
    if t is not None and t > c.truncation_max:
        return Finding(f"{t:.0%} of completions hit rollout.max_new_tokens (mean of the last {min(c.window, len(h))} "
                       "steps)", "raise rollout.max_new_tokens, or shape it: algo.overlong_buffer / algo.mask_truncated=true")
    return None


OFFPOLICY_ESS_MIN = 0.5  # window mean of offpolicy_ess below this: half the tokens carry the batch's weight
OFFPOLICY_DROPPED_MAX = 0.25  # window mean share of groups dropped as too stale (of those trained + dropped)


def offpolicy_drift(h: list[dict], c: MonitorConfig) -> Optional[Finding]:
    """Partial rollouts (rollout.max_staleness > 0): off-policy correction losing its footing. The behaviour
    weights pi_old / pi_behav grow so uneven that a few tokens carry the update (their effective sample
    size, window mean, falls below OFFPOLICY_ESS_MIN), or so many groups go stale that a large share of the
    sampling is thrown away (stale_dropped_groups / (train_groups + stale_dropped_groups) over the window above
    OFFPOLICY_DROPPED_MAX). Silent on a synchronous run (no staleness metrics)."""
    now = h[-c.window:]
    if len(now) < c.window or not all(finite(r.get("staleness_mean")) for r in now):
        return None
    action = ("lower rollout.max_staleness (1 is one-step-off), or switch algo.off_policy (decoupled caps each "
              "token's weight at algo.off_policy_cap; bypass needs no weight at all)")
    ess = window_mean(h, "offpolicy_ess", c.window)
    lag = mean(vals(now, "staleness_mean"))
    if ess is not None and ess < OFFPOLICY_ESS_MIN:
        cap = window_mean(h, "offpolicy_capped_frac", c.window)
        capped = f", {cap:.0%} of tokens above the cap" if cap is not None else ""
        return Finding(f"effective sample size of the behaviour weights {ess:.2f} (mean of the last {c.window} "
                       f"steps, < {OFFPOLICY_ESS_MIN:g}) at a mean staleness of {lag:.2f} policy versions{capped}: "
                       "a few tokens carry the update", action)
    dropped = sum(vals(now, "stale_dropped_groups"))
    trained = sum(vals(now, "train_groups"))
    share = dropped / (dropped + trained) if dropped + trained else 0.0
    if dropped and share > OFFPOLICY_DROPPED_MAX:
        return Finding(f"{share:.0%} of the groups were dropped as too stale over the last {c.window} steps "
                       f"({dropped:g} groups, mean staleness {lag:.2f}): the sampling is thrown away", action)
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
    "sandbox_gaming": Rule(sandbox_gaming),
    "offpolicy_drift": Rule(offpolicy_drift),
    "truncation": Rule(truncation, severity="warning"),
}
