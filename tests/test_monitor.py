"""The health monitor: every rule on synthetic metric histories (fires when it should, quiet
when it should not), the shared timing (minimum duration, cool-down) and severities, no alarm
over the saved metric traces of real healthy runs, the automatic actions, the stale-weights
canary on a real run, the shipped broken presets (each alarm before the damage it promises to
precede), and the run report."""

import copy
import dataclasses
import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tinyrl.config import with_fields as patched
from tinyrl.errors import ConfigError
from tinyrl.monitor import RULES, Alarm, Monitor, MonitorConfig, planned_action
from tinyrl.runs import read_jsonl

N = 40


def healthy(n: int = N, seed: int = 0) -> list[dict]:
    """A run that learns: reward creeps up, entropy eases down, nothing spikes (with noise)."""
    rng = random.Random(seed)
    rows = []
    for s in range(1, n + 1):
        f = (s - 1) / (n - 1)
        jit = lambda scale: 1 + scale * (rng.random() - 0.5)  # noqa: E731
        rows.append({
            "step": s, "reward_mean": (0.3 + 0.45 * f) * jit(0.1), "reward_group_std": 0.4 * jit(0.3),
            "zero_std_frac": 0.2 * jit(0.5), "entropy": (2.0 - 0.5 * f) * jit(0.1),
            "logp_pos_mean": -1.2 + 0.4 * f + 0.05 * (rng.random() - 0.5), "logp_pos_delta": 0.02 * jit(0.5),
            "frac_pos_delta_nonpos": 0.2 * jit(0.5), "grad_norm": 1.0 * jit(0.6), "skipped_nonfinite": False,
            "update_kl": 1e-4 * jit(0.5), "update_clip_frac": 0.01 * jit(0.5), "ref_kl": 0.002 * s * jit(0.2),
            "rollout_trainer_k3": 1e-6 * jit(0.5), "rollout_trainer_maxdiff": 1e-5 * jit(0.5),
            "completion_len": 12 * jit(0.2), "truncated_frac": 0.0,
        })
    return rows


def patch(rows: list[dict], key: str, fn, start: int = 1, stop: int = N + 1) -> list[dict]:
    """Set rows[key] = fn(step, old value) for steps in [start, stop)."""
    for r in rows:
        if start <= r["step"] < stop:
            r[key] = fn(r["step"], r.get(key))
    return rows


def agent(rows: list[dict], seed: int = 0) -> list[dict]:
    """Give a history the agent metrics of a healthy multi-turn run (tinyrl.metrics._agent_stats
    keys): ~1.5 tool calls per trajectory, a few failing, tool output ~30% of the completion."""
    rng = random.Random(seed)
    for r in rows:
        r.setdefault("tool_calls_per_traj", 1.5 * (1 + 0.3 * (rng.random() - 0.5)))
        r.setdefault("tool_error_rate", 0.1 * (1 + (rng.random() - 0.5)))
        r.setdefault("obs_token_frac", 0.3 * (1 + 0.3 * (rng.random() - 0.5)))
        r.setdefault("max_turns_frac", 0.1 * (1 + (rng.random() - 0.5)))
        r.setdefault("turns_mean", 2.5)
    return rows


def code(rows: list[dict]) -> list[dict]:
    """Give a history the sandbox counts of a healthy code run (tinyrl.rewards.code tallies, 16
    completions a step): passes grow with the reward, one completion in 16 writes no code."""
    for r in rows:
        passed = round(16 * r["reward_mean"])
        r.update({"sandbox/pass": passed, "sandbox/fail": 15 - passed, "sandbox/no_code": 1, "sandbox/timeout": 0,
                  "sandbox/crash": 0, "sandbox/output_limit": 0, "sandbox/error": 0, "sandbox/exit_call": 0})
    return rows


def partial(rows: list[dict]) -> list[dict]:
    """Give a history the metrics of healthy partial rollouts (rollout.max_staleness 1; tinyrl.inflight):
    about half the tokens one version old, the behaviour weights near 1, 8 groups trained a step."""
    for r in rows:
        r.update({"staleness_mean": 0.5, "staleness_max": 1, "stale_dropped_groups": 0, "carried_groups": 2,
                  "train_groups": 8, "offpolicy_ess": 0.95, "offpolicy_capped_frac": 0.0})
    return rows


def feed(rows: list[dict], cfg: MonitorConfig | None = None) -> list[Alarm]:
    mon = Monitor(cfg or MonitorConfig())
    out = []
    for r in rows:
        out += mon.update(r["step"], {k: v for k, v in r.items() if k != "step"})
    return out


def steps_of(alarms: list[Alarm], name: str) -> list[int]:
    return [a.step for a in alarms if a.name == name]


def test_a_healthy_run_raises_no_alarm():
    for seed in range(5):
        assert feed(healthy(seed=seed)) == [], seed
        assert feed(agent(healthy(seed=seed), seed)) == [], seed


def test_every_rule_is_a_table_entry_with_a_test_case():
    assert set(RULES) == {c[0] for c in CASES}


def _set(value):
    return lambda s, v: value


# (rule, what happens, mutation of the healthy run, first step the rule must fire at | None = quiet)
CASES = [
    ("entropy_collapse", "entropy falls to 15% at low reward", lambda r: patch(r, "entropy", _set(0.3), 12), 13),
    ("entropy_collapse", "entropy falls to 15% once solved", lambda r: patch(patch(r, "entropy", _set(0.3), 12),
                                                                           "reward_mean", _set(0.95), 12), None),
    ("entropy_collapse", "entropy falls to 60%", lambda r: patch(r, "entropy", _set(1.2), 12), None),
    ("entropy_collapse", "entropy falls to 27% but stays above the absolute floor",
     lambda r: patch(r, "entropy", _set(0.55), 12), None),
    ("entropy_collapse", "a one-step dip", lambda r: patch(r, "entropy", _set(0.3), 12, 13), None),
    ("advantage_collapse", "95% zero-std groups", lambda r: patch(r, "zero_std_frac", _set(0.95), 10), 14),
    ("advantage_collapse", "80% zero-std groups (a sparse reward: the search agent learns so)",
     lambda r: patch(r, "zero_std_frac", _set(0.8), 10), None),
    ("advantage_collapse", "two bad steps in a window", lambda r: patch(r, "zero_std_frac", _set(1.0), 10, 12), None),
    ("advantage_collapse", "80% zero-std groups because all are solved",
     lambda r: patch(patch(r, "zero_std_frac", _set(0.8), 10), "reward_mean", _set(0.97), 8), None),
    ("echo_trap", "group std falls 75% and entropy 40% at a low reward that does not rise",
     lambda r: patch(patch(patch(r, "reward_group_std", _set(0.1), 15), "entropy", _set(1.0), 15),
                     "reward_mean", _set(0.35)), 18),
    ("echo_trap", "group std falls 75% and entropy 40% while reward climbs 0.3 -> 0.5 (learning: groups get solved)",
     lambda r: patch(patch(r, "reward_group_std", _set(0.1), 15), "entropy", _set(1.0), 15), None),
    ("echo_trap", "group std falls 75% while entropy holds (a sparse reward's noise)",
     lambda r: patch(r, "reward_group_std", _set(0.1), 15), None),
    ("echo_trap", "group std falls 75% for two steps",
     lambda r: patch(patch(r, "reward_group_std", _set(0.1), 15, 17), "entropy", _set(1.0), 15), None),
    ("echo_trap", "group std falls because reward falls to ~0",
     lambda r: patch(patch(r, "reward_group_std", _set(0.05), 15), "reward_mean", _set(0.02), 15), None),
    ("echo_trap", "group std falls 75% once solved", lambda r: patch(patch(r, "reward_group_std", _set(0.1), 15),
                                                                     "reward_mean", _set(0.95), 15), None),
    ("echo_trap", "group std falls 25%", lambda r: patch(r, "reward_group_std", _set(0.3), 15), None),
    ("echo_trap", "a spread that was already tiny falls 75%",
     lambda r: patch(patch(r, "reward_group_std", _set(0.04)), "reward_group_std", _set(0.01), 15), None),
    ("lazy_likelihood", "most correct responses lose likelihood",
     lambda r: patch(patch(r, "frac_pos_delta_nonpos", _set(0.8), 20), "logp_pos_delta", _set(-0.2), 20), 21),
    ("lazy_likelihood", "one bad update", lambda r: patch(patch(r, "frac_pos_delta_nonpos", _set(1.0), 20, 21),
                                                          "logp_pos_delta", _set(-0.2), 20, 21), None),
    ("lazy_likelihood", "more than half dip a little while the mean rises (a healthy step)",
     lambda r: patch(patch(r, "frac_pos_delta_nonpos", _set(0.6), 20), "logp_pos_delta", _set(0.002), 20), None),
    ("lazy_likelihood", "correct likelihood falls while reward rises (the update's own effect not measured)",
     lambda r: patch(patch(r, "logp_pos_mean", lambda s, v: -0.5 - 0.05 * s), "logp_pos_delta", _set(None)), 15),
    ("lazy_likelihood", "correct likelihood falls while reward rises and the updates lower it a little",
     lambda r: patch(patch(r, "logp_pos_mean", lambda s, v: -0.5 - 0.05 * s), "logp_pos_delta", _set(-0.002)), 15),
    ("lazy_likelihood", "correct likelihood falls across steps while every update raises it (other responses "
     "are correct: an agent that learns to search)", lambda r: patch(r, "logp_pos_mean", lambda s, v: -0.5 - 0.05 * s),
     None),
    ("lazy_likelihood", "correct likelihood falls, reward flat",
     lambda r: patch(patch(r, "logp_pos_mean", lambda s, v: -0.5 - 0.05 * s), "reward_mean", _set(0.4)), None),
    ("lazy_likelihood", "correct likelihood drifts down by noise while reward rises",
     lambda r: patch(r, "logp_pos_mean", lambda s, v: -0.1 - 0.0005 * s), None),
    ("gradient_explosion", "grad norm 20x its median", lambda r: patch(r, "grad_norm", _set(20.0), 20, 21), 20),
    ("gradient_explosion", "a non-finite step (skipped)",
     lambda r: patch(patch(r, "grad_norm", _set(None), 7, 8), "skipped_nonfinite", _set(True), 7, 8), 7),
    ("gradient_explosion", "grad norm 3x", lambda r: patch(r, "grad_norm", _set(3.0), 20, 21), None),
    ("gradient_explosion", "grad norm 8x its median, small in absolute terms",
     lambda r: patch(patch(r, "grad_norm", _set(0.1)), "grad_norm", _set(0.8), 20, 21), None),
    ("gradient_explosion", "gradients return after a run of zeros",
     lambda r: patch(r, "grad_norm", lambda s, v: 0.0 if s < 20 else 1.0), None),
    ("kl_blowup", "KL to reference grows exponentially",
     lambda r: patch(r, "ref_kl", lambda s, v: 0.04 * 1.35 ** (s - 20), 21), 26),
    ("kl_blowup", "KL to reference grows quadratically", lambda r: patch(r, "ref_kl", lambda s, v: 1e-4 * s * s), None),
    ("kl_blowup", "update KL 0.5 per token for two steps", lambda r: patch(r, "update_kl", _set(0.5), 25, 27), 26),
    ("kl_blowup", "update KL 0.0211 against a median of 0.0018 (the reported false alarm)",
     lambda r: patch(patch(r, "update_kl", _set(0.0018)), "update_kl", _set(0.0211), 25, 27), None),
    ("kl_blowup", "one update KL spike", lambda r: patch(r, "update_kl", _set(0.5), 25, 26), None),
    ("kl_blowup", "update KL 0.3 per token from the first step (no median yet)",
     lambda r: patch(r, "update_kl", _set(0.3), 1, 4), 2),
    ("kl_blowup", "update KL 0.08 per token from the first step (below the ceiling, no median)",
     lambda r: patch(r, "update_kl", _set(0.08), 1, 4), None),
    ("kl_blowup", "clip fraction 0.4 for two steps", lambda r: patch(r, "update_clip_frac", _set(0.4), 25, 27), 26),
    ("kl_blowup", "clip fraction 0.1 (10x its median)", lambda r: patch(r, "update_clip_frac", _set(0.1), 25, 27), None),
    ("kl_blowup", "no reference pass (beta = 0)", lambda r: patch(r, "ref_kl", _set(None)), None),
    ("stale_weights", "mismatch from step 2", lambda r: patch(r, "rollout_trainer_k3", _set(0.03), 2), 2),
    ("stale_weights", "mismatch at step 1 only (never after a sync)",
     lambda r: patch(r, "rollout_trainer_k3", _set(0.5), 1, 2), None),
    ("stale_weights", "a steady bf16-sized noise floor",
     lambda r: patch(r, "rollout_trainer_k3", lambda s, v: 4e-3 if s == 1 else 6e-3), None),
    ("stale_weights", "mismatch 25x the noise floor",
     lambda r: patch(r, "rollout_trainer_k3", lambda s, v: 4e-3 if s < 9 else 0.1), 9),
    ("length_shortcut", "length falls 70% while reward rises", lambda r: patch(r, "completion_len", _set(3.5), 20), 23),
    ("length_shortcut", "length falls 70%, reward flat",
     lambda r: patch(patch(r, "completion_len", _set(3.5), 20), "reward_mean", _set(0.3)), None),
    ("length_shortcut", "a 4-token answer halves to 1.8 tokens while reward rises",
     lambda r: patch(patch(r, "completion_len", _set(4.0)), "completion_len", _set(1.8), 20), None),
    ("length_shortcut", "a 3-token answer shrinks to next to nothing while reward rises (notebook 03's hack)",
     lambda r: patch(patch(r, "completion_len", _set(3.0)), "completion_len", _set(1.2), 20), 24),
    ("length_explosion", "completions grow into the cap",
     lambda r: patch(patch(r, "truncated_frac", lambda s, v: min(1.0, 0.1 * (s - 15) + 0.05), 16),  # > 0.4 from 19
                     "completion_len", lambda s, v: min(24.0, 12 + 1.5 * (s - 15)), 16), 20),  # 2 steps
    ("length_explosion", "half the completions are cut but no longer than early on",
     lambda r: patch(r, "truncated_frac", _set(0.5), 16), "truncation"),
    ("length_explosion", "one step with most completions cut",
     lambda r: patch(patch(r, "truncated_frac", _set(0.8), 20, 21), "completion_len", _set(20.0), 20, 21), None),
    ("length_explosion", "a cap that is tight from the start",
     lambda r: patch(r, "truncated_frac", _set(0.6)), "truncation"),
    ("tool_use_collapse", "tool calls fall to zero after being used",
     lambda r: agent(patch(agent(r), "tool_calls_per_traj", _set(0.0), 20)), 25),
    ("tool_use_collapse", "tool calls fade out slowly (1.5 -> 0.05 over 20 steps)",
     lambda r: patch(agent(r), "tool_calls_per_traj", lambda s, v: max(0.05, 1.5 - 0.075 * (s - 10)), 10),
     32),  # window mean < 10% of its peak (~1.55) from step 31 (0.11), and 2 steps
    ("tool_use_collapse", "tool calls halve", lambda r: patch(agent(r), "tool_calls_per_traj", _set(0.7), 20), None),
    ("tool_use_collapse", "tools never used (a task answered without them)",
     lambda r: patch(patch(agent(r), "tool_calls_per_traj", _set(0.0)), "obs_token_frac", _set(0.0)), None),
    ("tool_use_collapse", "a few steps with no calls, then back",
     lambda r: patch(agent(r), "tool_calls_per_traj", _set(0.0), 20, 23), None),
    ("tool_loop", "trajectories pin at max_turns", lambda r: patch(agent(r), "max_turns_frac", _set(1.0), 10), 15),
    ("tool_loop", "tool output is 90% of the completions (a healthy search agent reading passages)",
     lambda r: patch(agent(r), "obs_token_frac", _set(0.9), 10), None),
    ("tool_loop", "a third of trajectories use all turns", lambda r: patch(agent(r), "max_turns_frac", _set(0.35)), None),
    ("tool_errors", "70% of tool calls fail", lambda r: patch(agent(r), "tool_error_rate", _set(0.7), 10), 14),
    ("tool_errors", "20% of tool calls fail", lambda r: patch(agent(r), "tool_error_rate", _set(0.2)), None),
    ("tool_errors", "every call fails, but almost no calls are made",
     lambda r: patch(patch(agent(r), "tool_error_rate", _set(1.0), 10), "tool_calls_per_traj", _set(0.05), 1), None),
    ("sandbox_gaming", "half the completions write no code block while reward rises",
     lambda r: patch(code(r), "sandbox/no_code", _set(8), 20), 23),
    ("sandbox_gaming", "a third of the completions call sys.exit while reward rises",
     lambda r: patch(code(r), "sandbox/exit_call", _set(6), 20), 23),
    ("sandbox_gaming", "half the completions write no code, reward flat",
     lambda r: patch(patch(code(r), "sandbox/no_code", _set(8), 20), "reward_mean", _set(0.3)), None),
    ("sandbox_gaming", "a healthy code run (one completion in 16 without code)", code, None),
    ("offpolicy_drift", "behaviour weights' ESS falls to 0.3 under partial rollouts",
     lambda r: patch(partial(r), "offpolicy_ess", _set(0.3), 20), 24),  # window mean < 0.5 from 23, and 2 steps
    ("offpolicy_drift", "half the groups dropped as too stale",
     lambda r: patch(partial(r), "stale_dropped_groups", _set(8), 20), 22),  # 16 of 56 (29%) at 21, and 2 steps
    ("offpolicy_drift", "healthy partial rollouts (ESS 0.95, one group in 16 dropped now and then)",
     lambda r: patch(partial(r), "stale_dropped_groups", lambda s, v: 1 if s % 5 == 0 else 0), None),
    ("offpolicy_drift", "a synchronous run with a low ESS-like value but no staleness metrics",
     lambda r: patch(r, "offpolicy_ess", _set(0.3), 20), None),
    ("truncation", "20% truncated", lambda r: patch(r, "truncated_frac", _set(0.2), 10), 12),
    ("truncation", "2% truncated", lambda r: patch(r, "truncated_frac", _set(0.02), 10), None),
]


@pytest.mark.parametrize("rule,what,mutate,first", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_rule_on_a_synthetic_history(rule, what, mutate, first):
    """`first`: the step the rule must first fire at; None: nothing fires; a rule name: the rule
    stays quiet and only that other rule fires (the case that belongs to it)."""
    alarms = feed(mutate(healthy()))
    fired = steps_of(alarms, rule)
    if isinstance(first, str):
        assert not fired and {a.name for a in alarms} == {first}, [(a.name, a.step) for a in alarms]
        return
    assert (fired[0] if fired else None) == first, [(a.name, a.step, a.evidence) for a in alarms]
    others = {a.name for a in alarms if a.severity == "alarm"} - {rule}
    assert not others, f"{what}: other alarms fired too: {others}"
    for a in alarms:
        assert a.evidence and a.action


def test_every_rule_says_what_it_detects_and_has_its_timing_in_the_config():
    cfg = MonitorConfig()
    for name, rule in RULES.items():
        assert rule.check.__doc__ and len(rule.check.__doc__.split()) >= 8, name
        assert getattr(cfg, f"{name}_steps") >= 1 and getattr(cfg, f"{name}_cooldown") >= 0, name
        assert rule.severity in ("alarm", "warning")
    assert [n for n, r in RULES.items() if r.severity == "warning"] == ["truncation"]


def test_a_rule_fires_again_after_its_cooldown_and_waits_its_duration():
    rows = patch(healthy(), "truncated_frac", _set(0.2), 10)  # holds from step 11 to the end (40)
    assert steps_of(feed(rows), "truncation") == [12]  # 2 steps, then quiet for 50
    assert steps_of(feed(rows, MonitorConfig(truncation_cooldown=10)), "truncation") == [12, 23, 34]
    assert steps_of(feed(rows, MonitorConfig(truncation_cooldown=0)), "truncation") == list(range(12, 41))
    assert steps_of(feed(rows, MonitorConfig(truncation_steps=5)), "truncation") == [15]
    # a streak that breaks starts again: entropy low at step 12, back at 13-19, low again from 20 (by step 20
    # the synthetic run's reward has risen 0.2, which the rule reads as learning: that test is off here)
    dips = patch(patch(healthy(), "entropy", _set(0.3), 12, 13), "entropy", _set(0.3), 20)
    no_learning_test = {"entropy_learning_rise": 1.0}
    assert steps_of(feed(dips, MonitorConfig(entropy_collapse_steps=3, **no_learning_test)), "entropy_collapse") == [22]
    assert steps_of(feed(dips, MonitorConfig(entropy_collapse_steps=3)), "entropy_collapse") == []


def test_every_skipped_step_is_reported_while_an_alarm_keeps_its_cooldown():
    rows = patch(healthy(), "entropy", _set(0.3), 12)
    for s in (7, 30):
        patch(patch(rows, "grad_norm", _set(None), s, s + 1), "skipped_nonfinite", _set(True), s, s + 1)
    alarms = feed(rows)
    assert steps_of(alarms, "entropy_collapse") == [13]
    skipped = [a for a in alarms if a.name == "gradient_explosion"]
    assert [a.step for a in skipped] == [7, 30] and all("skipped" in a.evidence for a in skipped)


def test_warnings_are_reported_with_their_severity_and_are_not_alarms():
    rows = patch(patch(healthy(), "truncated_frac", _set(0.2), 10), "entropy", _set(0.3), 20)
    mon = Monitor(MonitorConfig(entropy_learning_rise=1.0))  # (the reward's rise by step 20 would hold it back)
    raised = [a for r in rows for a in mon.update(r["step"], r)]
    assert {(a.name, a.severity) for a in raised} == {("truncation", "warning"), ("entropy_collapse", "alarm")}
    assert [a["name"] for a in mon.alarms] == ["entropy_collapse"]
    assert {a["name"]: a["severity"] for a in mon.fired} == {"truncation": "warning", "entropy_collapse": "alarm"}


def test_agent_rules_are_silent_without_agent_metrics():
    rows = healthy()
    assert not any("tool_calls_per_traj" in r or "tool_error_rate" in r for r in rows)
    assert all(RULES[n].check(rows[:k], MonitorConfig()) is None
               for n in ("tool_use_collapse", "tool_loop", "tool_errors") for k in range(1, N + 1))


# --------------------------------------------------------------------------- real healthy traces

TRACES = Path(__file__).parent / "data" / "monitor"


@pytest.mark.parametrize("preset, steps, seeds", [("tiny_grpo_cpu", 100, 6), ("tiny_search_cpu", 60, 6),
                                                  ("smollm2-135m_search_cpu", 4, 3), ("tiny_code_cpu", 25, 3)])
def test_no_alarm_over_the_metric_traces_of_real_healthy_runs(preset, steps, seeds):
    """metrics.jsonl of tiny_grpo_cpu (100 steps) and of the search agent tiny_search_cpu (60
    steps, multi-turn), seeds 0-5 (written by benchmarks/monitor_calibration.py; the keys the
    rules read, 5 significant digits). The thresholds were set from these with margin: e.g. the
    update KL reaches 0.08 per token and 6.3x its rolling median on tiny_grpo_cpu seed 0 (the
    ceiling is 0.2, the spike test 10x and 0.1), and on 3-step means up to 47% of the positive
    responses lose likelihood (but their mean rises: the lazy-likelihood test needs both). The
    search agent (the shipped model as of 2026-12-04) goes from a reward of ~0.15 to ~0.46 while
    its token entropy falls from ~0.9 to 0.29-0.36 nats (the closest any healthy trace comes to
    entropy_collapse: a single step under both limits), and tool output is 62-92% of its
    completions. The SmolLM2 search agent's traces are the GRPO stage of the shipped preset after its SFT cold
    start (4 steps at lr 2e-5, seeds 0-2, held-out EM 80 / 84 / 66%); tiny_code_cpu's are its 25 steps, seeds 0-2."""
    paths = sorted(TRACES.glob(f"{preset}-s*.jsonl"))
    assert len(paths) == seeds
    for path in paths:
        rows = read_jsonl(path)
        assert len(rows) == steps and "update_kl" in rows[0]
        mon = Monitor()
        for r in rows:
            mon.update(r["step"], r)
        assert mon.alarms == [], (path.name, mon.alarms)


def replay(rows, cfg=None) -> list:
    mon = Monitor(cfg) if cfg is not None else Monitor()
    for r in rows:
        mon.update(r["step"], r)
    return mon.alarms


def test_smollm2_learning_is_not_entropy_collapse_and_the_tiny_collapse_still_is():
    """The one real pretrained model here (smollm2-135m_grpo_cpu, 40 steps, benchmarks/monitor_calibration.py):
    its token entropy falls from ~1.1 to 0.13-0.22 nats (12-21% of its early value) while reward climbs ~0.25 ->
    0.7-0.8. The level test alone fires on it (steps 32 and 29 for seeds 0 and 1); the rule holds back while
    reward is clearly above its early mean. Seed 2 also met echo_trap's spread and entropy tests at step 25 (its
    groups agree as they get solved): the same learning test holds that back. The tiny model driven to collapse (tiny_entropy_collapse_cpu: entropy 0.36 -> 0.03, reward flat
    around 0.45) still raises it, at step 21 as before."""
    healthy_runs = sorted(TRACES.glob("smollm2-135m_grpo_cpu-s*.jsonl"))
    assert healthy_runs
    level_only = MonitorConfig(entropy_learning_rise=1e9)  # the rule without its learning test
    for path in healthy_runs:
        rows = read_jsonl(path)
        assert len(rows) == 40 and "entropy_adv_neg" in rows[0]
        assert replay(rows) == [], (path.name, replay(rows))
        assert "entropy_collapse" in {a["name"] for a in replay(rows, level_only)}, path.name
    assert len(healthy_runs) == 3 and "echo_trap" in {a["name"] for a in replay(read_jsonl(healthy_runs[2]), level_only)}
    collapse = read_jsonl(TRACES / "broken" / "tiny_entropy_collapse_cpu-s0.jsonl")
    fired = [a for a in replay(collapse) if a["name"] == "entropy_collapse"]
    assert fired[0]["step"] == 21 and "wrong samples" in fired[0]["evidence"]  # (again at 72: after the cool-down)


BROKEN = json.loads((TRACES / "broken" / "cases.json").read_text())


@pytest.mark.parametrize("trace", sorted(BROKEN))
def test_each_broken_real_model_trace_raises_its_alarm_before_its_damage(trace):
    """The SmolLM2 preset broken on purpose, one variant per alarm (benchmarks/monitor_calibration.py
    SMOLLM_BROKEN, exported with --export tests/data/monitor/broken): replayed under its own monitor config, each
    raises the alarm it must, before its damage step where the rule promises that. Fails when a threshold moves
    so that a broken run goes quiet or is caught late."""
    from tinyrl.config import load_config

    spec = BROKEN[trace]
    rows = read_jsonl(TRACES / "broken" / trace)
    fired = replay(rows, load_config(spec["preset"], dict(spec["overrides"]))[1].monitor)
    first: dict[str, int] = {}
    for a in fired:
        if a.get("severity", "alarm") == "alarm":
            first.setdefault(a["name"], a["step"])
    for name in spec["expect"]:
        assert name in first, (trace, name, fired)
        if name in spec["before_damage"] and spec["damage_step"] is not None:
            assert first[name] < spec["damage_step"], (trace, name, first[name], spec["damage_step"], spec["damage"])


def test_every_alarm_that_can_fire_on_smollm2_has_a_broken_trace():
    assert {spec["preset"] for spec in BROKEN.values()} == {"smollm2-135m_grpo_cpu"}
    assert sorted(n for spec in BROKEN.values() for n in spec["expect"]) == sorted([
        "stale_weights", "entropy_collapse", "kl_blowup", "lazy_likelihood", "length_explosion", "advantage_collapse"])


def test_stale_weights_is_fatal_unless_switched_off():
    rows = patch(healthy(), "rollout_trainer_k3", _set(0.03), 2)
    (alarm,) = feed(rows)
    assert alarm.name == "stale_weights" and alarm.fatal and "sync" in alarm.evidence
    (alarm,) = feed(rows, MonitorConfig(stale_fatal=False))
    assert not alarm.fatal
    assert feed(patch(healthy(), "rollout_trainer_maxdiff", _set(0.8), 5), MonitorConfig(stale_maxdiff=0.5))[0].step == 5


def test_rules_can_be_disabled_and_thresholds_moved():
    rows = patch(healthy(), "truncated_frac", _set(0.2), 10)
    assert feed(rows, MonitorConfig(disabled=["truncation"])) == []
    assert feed(rows, MonitorConfig(truncation_max=0.3)) == []
    moved = MonitorConfig(entropy_collapse_frac=0.7, entropy_collapse_abs=1.5)
    assert steps_of(feed(patch(healthy(), "entropy", _set(1.2), 12), moved), "entropy_collapse") == [13]


def test_monitor_state_survives_a_checkpoint():
    rows = patch(healthy(), "truncated_frac", _set(0.2), 10)
    mon = Monitor()
    for r in rows[:20]:
        mon.update(r["step"], r)
    restored = Monitor()
    restored.load_state_dict(copy.deepcopy(mon.state_dict()))
    assert [a["name"] for a in restored.fired] == ["truncation"]
    assert all(restored.update(r["step"], r) == [] for r in rows[20:])  # not raised a second time


def test_monitor_config_is_checked_like_the_run_config():
    from tinyrl.config import ConfigError
    from tinyrl.config import build as _build

    assert _build(MonitorConfig, {"window": 8, "disabled": ["echo_trap"]}, "monitor").window == 8
    with pytest.raises(ConfigError, match="monitor.window"):
        _build(MonitorConfig, {"window": 0}, "monitor")
    with pytest.raises(ConfigError, match="monitor.disabled"):
        _build(MonitorConfig, {"disabled": ["entropy"]}, "monitor")
    with pytest.raises(ConfigError, match="monitor.stale_k3"):
        _build(MonitorConfig, {"stale_k3": -1.0}, "monitor")


# --------------------------------------------------------------------------- automatic actions


def fake_trainer(**cfg) -> SimpleNamespace:
    from tinyrl.config import RunConfig

    return SimpleNamespace(cfg=RunConfig(), monitor=Monitor(MonitorConfig(**cfg)))


def first_alarm(trainer, rows, name) -> Alarm:
    for r in rows:
        for a in trainer.monitor.update(r["step"], r):
            if a.name == name:
                return a
    raise AssertionError(f"{name} did not fire")


def test_actions_are_off_by_default():
    t = fake_trainer()
    a = first_alarm(t, patch(healthy(), "zero_std_frac", _set(0.95), 10), "advantage_collapse")
    assert a.action_key == "dynamic_sampling" and planned_action(t.monitor, a, t.cfg) is None


def test_auto_dynamic_sampling_turns_it_on_as_a_config_patch():
    t = fake_trainer(auto_dynamic_sampling=True)
    a = first_alarm(t, patch(healthy(), "zero_std_frac", _set(0.95), 10), "advantage_collapse")
    act = planned_action(t.monitor, a, t.cfg)
    assert "dynamic_sampling" in act.message and act.patch == {"algo.dynamic_sampling": True}
    assert patched(t.cfg, act.patch).algo.dynamic_sampling is True and t.cfg.algo.dynamic_sampling is False
    on = patched(t.cfg, act.patch)
    assert planned_action(t.monitor, a, on).patch == {}  # already on: nothing to change


def test_auto_clip_higher_raises_epsilon_high():
    t = fake_trainer(auto_clip_higher=True, auto_epsilon_high=0.3)
    a = first_alarm(t, patch(healthy(), "entropy", _set(0.3), 12), "entropy_collapse")
    act = planned_action(t.monitor, a, t.cfg)
    assert "0.3" in act.message and act.patch == {"algo.epsilon_high": 0.3}
    algo = patched(t.cfg, act.patch).algo
    assert algo.epsilon_high == 0.3 and algo.epsilon_low == 0.2


def lora_of(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_auto_rollback_restores_the_last_checkpoint(tiny_model_dir, run_root, one_thread):
    from tests.test_training import small
    from tinyrl.api import build_trainer

    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
        "reward.functions": ["tests.test_training:reward_by_length"], "train.eval_before_after": False}))
    t.monitor = Monitor(MonitorConfig(auto_rollback=True))
    alarm = Alarm("gradient_explosion", 1, "grad norm 50x", "lower lr", action_key="rollback")
    rollback = planned_action(t.monitor, alarm, t.cfg)
    assert rollback.rollback and "no checkpoint" in t.take(rollback)
    t.train_step()
    t.save_checkpoint()
    saved = lora_of(t.model)
    t.train_step()
    assert any(not torch.equal(saved[n], p) for n, p in lora_of(t.model).items())
    calls = t.engine.calls
    assert "step-000001" in t.take(rollback)
    assert all(torch.equal(saved[n], p) for n, p in lora_of(t.model).items())
    assert t.state.step == 2 and t.engine.calls == calls and t.monitor.rollbacks == 1  # data and step count go on
    t.monitor.cfg.max_rollbacks = 1
    assert "nothing changed" in t.take(rollback)


# --------------------------------------------------------------------------- the canary, on a real run


def test_stale_weights_canary_stops_the_run(tiny_model_dir, run_root, one_thread):
    """The shipped broken engine (rollout.engine=stale, tinyrl/rollout/stale.py: a frozen copy of
    the initial policy whose sync does nothing) under a real run: the canary stops it at step 2."""
    from tests.test_training import small
    from tinyrl import api
    from tinyrl.errors import StaleWeightsError

    with pytest.raises(StaleWeightsError, match="stale_weights at step 2"):
        api.train(**small(tiny_model_dir, run_root, **{
            "reward.functions": ["tests.test_training:reward_by_length"], "train.eval_before_after": False,
            "train.steps": 4, "log.name": "stale", "rollout.engine": "stale"}))
    path = Path(run_root) / "stale"
    rows = read_jsonl(path / "metrics.jsonl")
    assert len(rows) == 2  # stopped at step 2 of 4
    assert rows[0]["rollout_trainer_k3"] < 1e-5 < 1e-3 < rows[1]["rollout_trainer_k3"]  # step 1 shares the weights
    alarms = read_jsonl(path / "alarms.jsonl")  # every alarm of the step is written before the run stops
    (alarm,) = [a for a in alarms if a["name"] == "stale_weights"]
    assert alarm["fatal"] and alarm["step"] == 2 and {a["step"] for a in alarms} <= {1, 2}
    # the stopped run still gets its summary and report
    summary = json.loads((path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["error"].startswith("StaleWeightsError") and "stale_weights" in summary["alarms"]
    assert "verdict: STOPPED - stale_weights at step 2" in (path / "report.txt").read_text()


def test_stale_weights_canary_watches_the_fresh_tokens_of_partial_rollouts(tiny_model_dir, run_root, one_thread):
    """With partial rollouts a batch mixes policy versions on purpose; the canary reads the tokens the
    current adapter sampled (rollout_trainer_k3_fresh) and still stops the broken engine."""
    from tests.test_training import small
    from tinyrl import api
    from tinyrl.errors import StaleWeightsError

    with pytest.raises(StaleWeightsError, match="stale_weights at step"):
        api.train(**small(tiny_model_dir, run_root, **{
            "reward.functions": ["tests.test_training:reward_by_length"], "train.eval_before_after": False,
            "train.steps": 6, "log.name": "stale", "rollout.engine": "stale", "rollout.max_staleness": 1}))
    rows = read_jsonl(Path(run_root) / "stale" / "metrics.jsonl")
    assert any(r.get("staleness_max") for r in rows) and rows[-1]["rollout_trainer_k3_fresh"] > 1e-3


# --------------------------------------------------------------------------- collapse


def reward_collapse_step(rows: list[dict], k: int = 3, frac: float = 0.5):
    """First step whose k-step mean reward is below frac x the mean of the first k steps."""
    r = [x["reward_mean"] or 0.0 for x in rows]
    early = sum(r[:k]) / k
    return next((rows[i]["step"] for i in range(k, len(r)) if sum(r[i - k + 1:i + 1]) / k < frac * early), None)


def test_entropy_alarm_comes_before_a_reward_collapse_that_follows_it():
    """The shape the entropy rule is for (an LLM run narrowing onto one answer, then failing):
    entropy decays from step 8 while reward holds at 0.5, and the reward collapses at step 24."""
    rows = patch(healthy(), "entropy", lambda s, v: 2.0 * 0.8 ** (s - 7), 8)
    rows = patch(patch(rows, "reward_mean", _set(0.5), 1, 24), "reward_mean", _set(0.05), 24)
    alarms = feed(rows)
    fired, collapsed = steps_of(alarms, "entropy_collapse"), reward_collapse_step(rows)
    assert collapsed == 25 and fired and fired[0] < collapsed - 5


@pytest.fixture
def one_thread():
    """Tiny matrices: one intra-op thread is faster, and immune to a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def train_shipped_preset(preset: str, run_dir: Path):
    """Run a preset on the shipped tiny-arith model, on one thread (tiny matrices: faster, and
    immune to a busy machine)."""
    from tinyrl.api import train
    from tinyrl.model import resolve_model

    if not (Path(resolve_model("tiny-arith").path) / "config.json").exists():
        pytest.skip("the shipped tiny-arith model is not built (python scripts/pretrain_tiny.py)")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(preset, **{"log.run_dir": str(run_dir), "log.progress": False, "train.eval_before_after": False})
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module")
def collapse_run(tmp_path_factory):
    return train_shipped_preset("tiny_collapse_cpu", tmp_path_factory.mktemp("collapse"))


def test_collapse_preset_is_flagged_before_the_reward_collapses(collapse_run):
    rows = collapse_run.metrics
    first = {}
    for a in collapse_run.alarms:
        first.setdefault(a["name"], a["step"])
    collapsed = reward_collapse_step(rows)
    assert rows[0]["reward_mean"] > 0.1, "the base model must solve some sums for a collapse to show"
    assert collapsed is not None, [r["reward_mean"] for r in rows]
    assert first.get("lazy_likelihood", math.inf) < collapsed, (first, collapsed)
    assert "stale_weights" not in first  # the engine does sample from the trained weights


def test_report_of_the_collapse_run(collapse_run):
    from tinyrl.report import write_report

    text = write_report(collapse_run.path)
    assert "lazy_likelihood" in text and "verdict: NEEDS A LOOK - reward fell" in text
    assert (collapse_run.path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def entropy_collapse_run(tmp_path_factory):
    return train_shipped_preset("tiny_entropy_collapse_cpu", tmp_path_factory.mktemp("entropy"))


def _rolling(values: list[float], i: int, w: int = 5) -> float:
    x = values[max(0, i - w + 1): i + 1]
    return sum(x) / len(x)


def test_entropy_collapse_preset_is_flagged_while_the_reward_still_looks_healthy(entropy_collapse_run):
    """A real run (the shipped model, tiny_entropy_collapse_cpu) that narrows onto one answer per
    prompt: the entropy alarm fires while the reward is still near its best, i.e. before a user
    watching the reward curve could tell; after it the run has no learning signal left and the
    reward never climbs past where it was (it plateaus and, on most seeds, slides)."""
    rows = entropy_collapse_run.metrics
    reward = [r["reward_mean"] or 0.0 for r in rows]
    entropy = [r["entropy"] for r in rows]
    fired = next((a["step"] for a in entropy_collapse_run.alarms if a["name"] == "entropy_collapse"), None)
    assert fired is not None and fired <= 50, [round(e, 3) for e in entropy]
    i = fired - 1
    early = sum(entropy[:3]) / 3
    assert sum(entropy[-10:]) / 10 < 0.2 * early  # it really collapsed, not a noisy dip
    at_alarm = _rolling(reward, i)
    assert at_alarm >= 0.8 * max(_rolling(reward, k) for k in range(i + 1)), "the reward looked fine then"
    assert at_alarm < 0.9 and max(_rolling(reward, k) for k in range(i, len(reward))) < 0.9  # never solved
    later = rows[i + 5:]
    assert sum(r["zero_std_frac"] for r in later) / len(later) >= 0.8  # groups answer all alike
    assert "stale_weights" not in {a["name"] for a in entropy_collapse_run.alarms}


# --------------------------------------------------------------------------- the run report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path, rows, alarms, summary=None):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "alarms.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alarms))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))


def test_report_lists_alarms_and_a_verdict_and_draws_a_png(tmp_path):
    from tinyrl.report import write_report

    rows = patch(healthy(), "entropy", _set(0.3), 12)
    mon = Monitor()
    for r in rows:
        mon.update(r["step"], r)
    write_run(tmp_path / "run", rows, mon.fired, {"eval_before": 0.2, "eval_after": 0.5})
    text = write_report(tmp_path / "run")
    assert (tmp_path / "run" / "report.txt").read_text() == text
    assert "entropy_collapse" in text and "step   13" in text and "clip-higher" in text
    assert "verdict: NEEDS A LOOK" in text and "entropy_collapse" in text.splitlines()[-1]
    assert "20.0% -> 50.0%" in text
    reward_line = next(line for line in text.splitlines() if line.strip().startswith("reward "))
    first, last, lo, hi = map(float, reward_line.split()[-4:])
    assert (first, last) == (pytest.approx(rows[0]["reward_mean"], rel=1e-3), pytest.approx(rows[-1]["reward_mean"], rel=1e-3))
    assert lo <= min(first, last) and hi >= max(first, last)
    png = (tmp_path / "run" / "metrics.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000


def test_report_verdicts(tmp_path):
    from tinyrl.report import write_report

    write_run(tmp_path / "ok", healthy(), [])
    assert "verdict: HEALTHY - reward rose" in write_report(tmp_path / "ok")
    rows = patch(healthy(), "rollout_trainer_k3", _set(0.03), 2)[:2]
    write_run(tmp_path / "stale", rows, [dataclasses.asdict(feed(rows)[0])])
    assert "verdict: STOPPED - stale_weights at step 2" in write_report(tmp_path / "stale")
    (tmp_path / "started").mkdir()  # a run that has written its config and no step yet
    (tmp_path / "started" / "config.yaml").write_text("train: {steps: 10}\n")
    assert "verdict: NO DATA" in write_report(tmp_path / "started")
    assert not (tmp_path / "started" / "metrics.png").exists()
    (tmp_path / "empty").mkdir()  # not a run folder at all: an error, and nothing written into it
    with pytest.raises(ConfigError, match="not a tinyrl run folder"):
        write_report(tmp_path / "empty")
    assert not any((tmp_path / "empty").iterdir())


def test_report_judges_progress_on_held_out_accuracy_when_it_was_measured(tmp_path):
    """A sparse reward (the search agent's EM) can stay flat while greedy held-out accuracy climbs;
    a reward can rise on what does not transfer. Where before/after were measured, they decide."""
    from tinyrl.report import write_report

    flat = [dict(r, reward_mean=0.1) for r in healthy()]
    write_run(tmp_path / "agent", flat, [], {"eval_before": 0.01, "eval_after": 0.13})
    assert write_report(tmp_path / "agent").splitlines()[-1].startswith(
        "verdict: HEALTHY - reward stayed flat (0.100 -> 0.100), held-out accuracy rose (1.0% -> 13.0%)")
    write_run(tmp_path / "overfit", healthy(), [], {"eval_before": 0.40, "eval_after": 0.41})
    last = write_report(tmp_path / "overfit").splitlines()[-1]
    assert last.startswith("verdict: NO PROGRESS - reward rose") and "held-out accuracy stayed flat" in last
    write_run(tmp_path / "no_eval", flat, [], {"eval_before": None, "eval_after": None})
    assert write_report(tmp_path / "no_eval").splitlines()[-1].startswith("verdict: NO PROGRESS - reward stayed flat")


def test_report_keeps_warnings_out_of_the_verdict(tmp_path):
    from tinyrl.report import write_report

    rows = patch(healthy(), "truncated_frac", _set(0.2), 10)
    mon = Monitor()
    for r in rows:
        mon.update(r["step"], r)
    assert [a["severity"] for a in mon.fired] == ["warning"]
    write_run(tmp_path / "run", rows, mon.fired)
    text = write_report(tmp_path / "run")
    assert "truncation (warning)" in text
    assert text.splitlines()[-1].startswith("verdict: HEALTHY - reward rose") and "warnings: truncation" in text
