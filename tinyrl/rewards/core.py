"""The rewards API: plain functions with TRL's signature, combined with weights.

A reward function is `f(prompts, completions, **columns) -> list[float | None]`, where
`columns` are the dataset columns of each row (lists as long as `completions`) plus
`completion_ids`. TRL reward functions plug in unchanged; a function without `**kwargs`
gets only the columns it names. A reward that is not callable, does not take
`completions`, or is given `kwargs` its signature does not accept fails at load.

Rewards never crash a run. They are called in a process of their own, forked from the
trainer once (`tinyrl.rewards.isolation`; `reward.isolate: false` calls them in the trainer's
process instead), so that `os._exit`, a segfault in a native extension or a runaway allocation
ends the reward call, not the run. A call that raises (SystemExit included), ends its process,
returns something that is not one number per completion (a dict, a 2-D list or array, the
wrong length), or runs past the timeout scores NaN for the whole call; a sample scored None,
NaN, +-inf, a non-number or a number beyond float32's range scores NaN alone. Every such
failure is counted (`RewardReport.failures`, per component) and logged (the first few per
component, then every 100th); a NaN total is excluded from advantages and from the loss, and
never written to metrics as a number. Totals are combined in float64. A batch with no usable
reward at all is said. Ctrl-C (KeyboardInterrupt) still stops the run. What a reward tallies on the
way (`tinyrl.rewards.tally`: the code sandbox's outcome counts and seconds) comes back with its
scores, from its process too, as `RewardReport.tallies`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from tinyrl.errors import RewardImportError
from tinyrl.registry import Registry, load_object
from tinyrl.rewards import tally
from tinyrl.rewards.isolation import CAN_FORK, RewardProcess

log = logging.getLogger("tinyrl.rewards")

DEFAULT_TIMEOUT = 300.0  # seconds per reward call (one call scores a whole batch); RewardConfig.timeout
RewardFn = Callable[..., list]
# name -> reward function; a library reward's module (math-verify, the sandbox, TRL) loads when a run uses it
REWARDS = Registry("reward", {
    "code_tests": "tinyrl.rewards.code:code_tests_reward",
    "think_answer_format": "tinyrl.rewards.format:think_answer_format_reward",
    "answer_format": "tinyrl.rewards.format:answer_format_reward",
    "one_answer": "tinyrl.rewards.format:one_answer_reward",
    "math_strict": "tinyrl.rewards.math:math_strict_reward",
    "math_lenient": "tinyrl.rewards.math:math_lenient_reward",
    "qa_em": "tinyrl.rewards.qa:qa_em_reward",
    "qa_f1": "tinyrl.rewards.qa:qa_f1_reward",
    "search_r1_format": "tinyrl.rewards.qa:search_r1_format_reward",
    "gaia": "tinyrl.rewards.qa:gaia_reward",
    "trl": "tinyrl.rewards.trl_compat:trl_reward",
})


def register(name: str):
    """Decorator: make a reward function available to presets by `name`."""

    def wrap(fn: RewardFn) -> RewardFn:
        return REWARDS.register(name, fn)

    return wrap


def resolve_reward(name: str, task=None, kwargs: dict | None = None) -> RewardFn:
    """`task` (the task's own verifier), a registry name, or `package.module:function`."""
    if name == "task":
        if task is None:
            raise RewardImportError("reward 'task' needs a built-in task (data.task)")
        fn = task.reward
    elif name in REWARDS:
        fn = REWARDS[name]
    elif ":" in name:
        try:
            fn = load_object(name)
        except (ImportError, AttributeError) as e:
            raise RewardImportError(
                f"reward.functions: cannot import {name!r} ({type(e).__name__}: {e}). "
                f"Use 'module.path:function' of an importable module, or one of {sorted(REWARDS)}."
            ) from e
    else:
        raise RewardImportError(
            f"reward.functions: unknown reward {name!r}; use 'task', one of {sorted(REWARDS)}, "
            f"or 'module.path:function'."
        )
    check_signature(name, fn, kwargs or {})
    return functools.partial(fn, **kwargs) if kwargs else fn


def check_signature(name: str, fn, kwargs: dict) -> None:
    """Fail at load, naming the reward, when `fn` cannot be called as a reward with `kwargs` bound."""
    if not callable(fn):
        raise RewardImportError(f"reward.functions: {name!r} is a {type(fn).__name__}, not a function")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or extension callable: nothing to check
    params = sig.parameters.values()
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    by_name = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if "completions" not in by_name and not var_kw:
        raise RewardImportError(
            f"reward.functions: {name!r} must take `completions` by name (TRL's signature is "
            f"f(prompts, completions, **columns) -> list[float | None]); its signature is {sig}")
    unknown = sorted(set(kwargs) - by_name) if not var_kw else []
    if unknown:
        raise RewardImportError(f"reward.functions: {name!r} does not take the kwargs {unknown} "
                                f"its preset gives it; its signature is {sig}")


def _accepted_kwargs(fn) -> set[str] | None:
    """The keyword names `fn` takes, or None when it takes any (`**kwargs`, or not inspectable)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


class _Timeout:
    def __repr__(self) -> str:
        return "TIMEOUT"


TIMEOUT = _Timeout()


def call_with_timeout(fn, kwargs: dict, timeout: float | None) -> tuple[str, Any]:
    """Run `fn(**kwargs)`: ("ok", value), ("error", exception) or ("timeout", TIMEOUT).

    The in-process path (`reward.isolate: false`, for a reward that must share this
    process: a model on its CUDA card, state the trainer reads). With a timeout the call
    runs in a fresh daemon thread and the caller waits at most `timeout` seconds. Python
    cannot kill a thread, so a call that times out is left running in the background as a
    daemon thread (it dies with the process; if it returns later its result is dropped).
    A reward that must run on the main thread (one that installs signal handlers) needs
    `timeout=None` here: it is then called directly, with no timeout. (The default, the
    rewards' own process, calls every reward on that process's main thread and kills it
    at the timeout.)

    SystemExit and every other exception from the reward come back as ("error", e);
    KeyboardInterrupt is raised again here (Ctrl-C stops the run, wherever it lands).
    """
    if timeout is None:
        try:
            return "ok", fn(**kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 (SystemExit from a reward must not end the run)
            return "error", e
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(**kwargs)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    worker = threading.Thread(target=target, name="tinyrl-reward", daemon=True)
    worker.start()
    worker.join(timeout)  # interruptible: Ctrl-C raises KeyboardInterrupt here
    if worker.is_alive():
        return "timeout", TIMEOUT
    if "error" in box:
        if isinstance(box["error"], KeyboardInterrupt):
            raise box["error"]
        return "error", box["error"]
    return "ok", box.get("value")


def as_values(out, n: int) -> list:
    """The reward's return value as a list of `n` scalars, or ValueError saying what is wrong with it.

    >>> as_values([1, None, 0.5], 3)
    [1, None, 0.5]
    >>> as_values({"a": 1.0}, 1)
    Traceback (most recent call last):
    ...
    ValueError: returned a dict, not a list of 1 numbers (one per completion)
    """
    if out is None or isinstance(out, (str, bytes, Mapping)) or not hasattr(out, "__iter__"):
        raise ValueError(f"returned a {type(out).__name__}, not a list of {n} numbers (one per completion)")
    shape = getattr(out, "shape", None)
    if shape is not None and len(shape) != 1:
        raise ValueError(f"returned an array of shape {tuple(shape)}, not [{n}] (one number per completion)")
    out = list(out)
    if len(out) != n:
        raise ValueError(f"returned {len(out)} values for {n} completions")
    for k, v in enumerate(out):
        if isinstance(v, (list, tuple, set, Mapping)) or (getattr(v, "ndim", 0) or 0) > 0:
            raise ValueError(f"returned a 2-D value (item {k} is a {type(v).__name__}), not one number per completion")
    return out


FLOAT32_MAX = 3.4028234663852886e38  # rewards are float32 tensors: a larger magnitude would become inf there


def to_score(v) -> float:
    """One sample's score as a float; NaN for None, NaN, +-inf, a number beyond float32's range (it
    would be inf in the rewards tensor), a string or anything that is not a number.

    >>> [to_score(x) for x in (1, True, 0.5, None, float("inf"), "1.0", 2e38, 1e39)]
    [1.0, 1.0, 0.5, nan, nan, nan, 2e+38, nan]
    """
    if v is None or isinstance(v, (str, bytes)):
        return math.nan
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return f if abs(f) <= FLOAT32_MAX else math.nan  # NaN and +-inf fail the test too


def outcome(fn, kwargs: dict, n: int) -> tuple[list[float], tuple | None, dict]:
    """`fn(**kwargs)` as n scores, (how many, first index, its value's repr) of the samples that scored
    no number (None when all did), and what the call tallied (`tinyrl.rewards.tally`). Raises what the
    reward raises, or ValueError for a wrong shape."""
    with tally.collecting() as tallied:
        values = as_values(fn(**kwargs), n)
    scores = [to_score(v) for v in values]
    bad = [k for k, f in enumerate(scores) if math.isnan(f)]
    return scores, (len(bad), bad[0], repr(values[bad[0]])[:200]) if bad else None, tallied


def reply(fn, kwargs: dict, n: int) -> tuple[str, Any]:
    """`outcome` as the rewards' process sends it back: ("ok", outcome), ("error", text) or ("interrupt", None)."""
    try:
        return "ok", outcome(fn, kwargs, n)
    except KeyboardInterrupt:
        return "interrupt", None
    except BaseException as e:  # noqa: BLE001 (SystemExit included: a reward must never end the run)
        return "error", f"{type(e).__name__}: {e}"[:2000]


def reward_name(spec_name: str) -> str:
    return spec_name.rsplit(":", 1)[-1]


@dataclass
class RewardReport:
    failures: dict[str, int] = field(default_factory=dict)  # component -> samples that failed
    errors: dict[str, str] = field(default_factory=dict)  # component -> last exception text
    timeouts: dict[str, int] = field(default_factory=dict)  # component -> calls cut off by the timeout
    excluded: int = 0  # samples whose total is NaN
    tallies: dict[str, float] = field(default_factory=dict)  # key -> sum of what the rewards tallied (sandbox outcomes)

    def counts(self) -> dict[str, float]:
        """The step's counts as metrics keys: failed samples per component, and the rewards' tallies."""
        return {**{f"reward_failures/{k}": v for k, v in self.failures.items()}, **self.tallies}


class RewardSet:
    """The run's weighted reward components. Call it on a Rollouts to fill its rewards.

    `timeout`: seconds one call of one reward may take (None: no limit). `isolate`: call the
    rewards in their own process (see `tinyrl.rewards.isolation`; past the timeout it is killed);
    False: in this process, on a thread (None: on this thread), see `call_with_timeout`."""

    LOG_FIRST, LOG_EVERY = 3, 100  # failures logged per component: the first few, then every 100th

    def __init__(self, specs, task=None, combine: str = "sum", timeout: float | None = DEFAULT_TIMEOUT,
                 isolate: bool = True):
        self.components: list[tuple[str, RewardFn, float]] = []
        for spec in specs:
            name = reward_name(spec.name)
            base = name
            k = 2
            while any(name == c[0] for c in self.components):
                name, k = f"{base}_{k}", k + 1
            self.components.append((name, resolve_reward(spec.name, task, spec.kwargs), spec.weight))
        self.combine = combine
        self.timeout = timeout
        self.isolate = isolate and CAN_FORK  # call the rewards in their own process (tinyrl.rewards.isolation)
        self._process: RewardProcess | None = None
        self.total_failures: dict[str, int] = {c[0]: 0 for c in self.components}
        self._failed_calls: dict[str, int] = {}

    def score(self, prompts, completions, columns: list[dict], completion_ids=None):
        """Returns (total [N] with NaN for excluded, {name: [N]}, RewardReport)."""
        n = len(completions)
        col_lists: dict[str, list] = {}
        for key in (columns[0].keys() if columns else []):
            col_lists[key] = [row.get(key) for row in columns]
        if completion_ids is not None:
            col_lists["completion_ids"] = completion_ids
        report = RewardReport()
        comps: dict[str, torch.Tensor] = {}
        process = self._reward_process()
        for k, (name, fn, _) in enumerate(self.components):
            comps[name] = self._call(name, k, fn, process, prompts, completions, col_lists, n, report)
        total = self._combine(comps)
        report.excluded = int(torch.isnan(total).sum())
        for k, v in report.failures.items():
            self.total_failures[k] = self.total_failures.get(k, 0) + v
        return total, comps, report

    def _reward_process(self) -> RewardProcess | None:
        """The process the components are called in (forked at the first call; again for new components)."""
        if not self.isolate:
            return None
        fns = [fn for _, fn, _ in self.components]
        if self._process is None or self._process.fns != fns:
            if self._process is not None:
                self._process.close()
            self._process = RewardProcess(fns, reply)
        return self._process

    def start(self) -> None:
        """Fork the rewards' process now, on this thread (see `RewardProcess.start`); a no-op in-process."""
        process = self._reward_process()
        if process is not None:
            process.start()

    def close(self) -> None:
        """End the rewards' process (it also ends with this object, and with the trainer's process)."""
        if self._process is not None:
            self._process.close()
            self._process = None

    def _call(self, name, k, fn, process, prompts, completions, col_lists, n, report) -> torch.Tensor:
        kwargs = {"prompts": prompts, "completions": completions, **col_lists}
        accepted = _accepted_kwargs(fn)
        if accepted is not None:
            kwargs = {key: v for key, v in kwargs.items() if key in accepted}
        if process is not None:
            status, out = process.run(k, kwargs, n, self.timeout)  # ("ok", reply) | ("error", text) | ("timeout", _)
            if status == "ok":
                status, out = out
                if status == "interrupt":  # the reward raised KeyboardInterrupt itself: it stops the run, as ever
                    raise KeyboardInterrupt
            left = "its process was stopped"
        else:
            status, out = call_with_timeout(outcome, {"fn": fn, "kwargs": kwargs, "n": n}, self.timeout)
            out = f"{type(out).__name__}: {out}" if status == "error" else out
            left = "left running in a background thread"
        if status != "ok":
            if status == "timeout":
                report.timeouts[name] = 1
                out = f"TimeoutError: did not return within reward.timeout={self.timeout:g} s ({left})"
            report.failures[name] = n
            report.errors[name] = out
            self._log(name, "reward %r failed on the whole batch (%s); %d samples excluded", name, out, n)
            return torch.full((n,), float("nan"))
        vals, bad, tallied = out
        for key, v in tallied.items():
            report.tallies[key] = report.tallies.get(key, 0) + v
        if bad:
            report.failures[name] = bad[0]
            self._log(name, "reward %r: %d of %d samples scored no finite number (e.g. sample %d: %s); excluded",
                      name, bad[0], n, bad[1], bad[2])
        return torch.tensor(vals, dtype=torch.float32)

    def _log(self, name: str, msg: str, *args) -> None:
        """Rate-limited warning: the first LOG_FIRST failing calls of a component, then every LOG_EVERY-th."""
        k = self._failed_calls[name] = self._failed_calls.get(name, 0) + 1
        if k <= self.LOG_FIRST or k % self.LOG_EVERY == 0:
            more = f" [failing call {k} of {name!r}; from now on every {self.LOG_EVERY}th is logged]" \
                if k >= self.LOG_FIRST else ""
            log.warning(msg + "%s", *args, more)

    def _combine(self, comps: dict[str, torch.Tensor]) -> torch.Tensor:
        """The weighted total (float32), computed in float64: huge finite rewards keep finite statistics;
        a total beyond float32's range is excluded (NaN) and said."""
        total = None
        for name, _, weight in self.components:
            v = comps[name].double()
            if self.combine == "normalize_then_sum":
                ok = ~torch.isnan(v)
                if ok.sum() > 1:
                    v = (v - v[ok].mean()) / (v[ok].std() + 1e-6)
            total = weight * v if total is None else total + weight * v  # NaN propagates: excluded
        if total is None:
            return torch.zeros(0)
        if self.combine == "sum_then_normalize":
            ok = ~torch.isnan(total)
            if ok.sum() > 1:
                total = (total - total[ok].mean()) / (total[ok].std() + 1e-6)
        over = total.abs() > FLOAT32_MAX
        if over.any():
            total = torch.where(over, torch.full_like(total, math.nan), total)
            self._log("(total)", "the weighted reward total of %d of %d samples is beyond float32's range "
                      "(|total| > 3.4e38); excluded", int(over.sum()), len(total))
        return total.float()


def score_rollouts(rollouts, rewards: RewardSet) -> tuple[Any, RewardReport]:
    """Fill `rollouts.rewards` and `rollouts.reward_components`; return (rollouts, report). A batch in which
    no sample has a usable reward teaches nothing: that is said (rate-limited), with what failed."""
    ids = [row[m.bool()].tolist() for row, m in zip(rollouts.completion_ids, rollouts.completion_mask)]
    total, comps, report = rewards.score(rollouts.prompts, rollouts.completions, rollouts.columns, ids)
    rollouts.rewards = total
    rollouts.reward_components = comps
    n = len(total)
    if n and report.excluded == n:
        failed = ", ".join(f"{k}: {v}" for k, v in report.failures.items()) or "their weighted totals"
        rewards._log("(all)", "no sample of this batch has a usable reward (all %d excluded; failed: %s): "
                     "it teaches nothing", n, failed)
    return rollouts, report
