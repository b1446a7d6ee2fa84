"""The rewards API: plain functions with TRL's signature, combined with weights.

A reward function is `f(prompts, completions, **columns) -> list[float | None]`, where
`columns` are the dataset columns of each row (lists as long as `completions`) plus
`completion_ids`. TRL reward functions plug in unchanged.

Rewards never crash a run: a function that raises, returns the wrong length, or returns
None / NaN for a sample is counted and logged, and that sample's total is NaN (excluded
from advantages and from the loss).
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

log = logging.getLogger("tinyrl.rewards")

RewardFn = Callable[..., list]
REWARDS: dict[str, RewardFn] = {}


def register(name: str):
    """Decorator: make a reward function available to presets by `name`."""

    def wrap(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return wrap


class RewardImportError(ValueError):
    pass


def resolve_reward(name: str, task=None, kwargs: dict | None = None) -> RewardFn:
    """`task` (the task's own verifier), a registry name, or `package.module:function`."""
    if name == "task":
        if task is None:
            raise RewardImportError("reward 'task' needs a built-in task (data.task)")
        fn = task.reward
    elif name in REWARDS:
        fn = REWARDS[name]
    elif ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
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
    return functools.partial(fn, **kwargs) if kwargs else fn


def reward_name(spec_name: str) -> str:
    return spec_name.rsplit(":", 1)[-1]


@dataclass
class RewardReport:
    failures: dict[str, int] = field(default_factory=dict)  # component -> samples that failed
    errors: dict[str, str] = field(default_factory=dict)  # component -> last exception text
    excluded: int = 0  # samples whose total is NaN


class RewardSet:
    """The run's weighted reward components. Call it on a Rollouts to fill its rewards."""

    def __init__(self, specs, task=None, combine: str = "sum"):
        self.components: list[tuple[str, RewardFn, float]] = []
        for spec in specs:
            name = reward_name(spec.name)
            base = name
            k = 2
            while any(name == c[0] for c in self.components):
                name, k = f"{base}_{k}", k + 1
            self.components.append((name, resolve_reward(spec.name, task, spec.kwargs), spec.weight))
        self.combine = combine
        self.total_failures: dict[str, int] = {c[0]: 0 for c in self.components}

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
        for name, fn, _ in self.components:
            comps[name] = self._call(name, fn, prompts, completions, col_lists, n, report)
        total = self._combine(comps)
        report.excluded = int(torch.isnan(total).sum())
        for k, v in report.failures.items():
            self.total_failures[k] = self.total_failures.get(k, 0) + v
        return total, comps, report

    def _call(self, name, fn, prompts, completions, col_lists, n, report) -> torch.Tensor:
        try:
            out = fn(prompts=prompts, completions=completions, **col_lists)
            out = list(out)
            if len(out) != n:
                raise ValueError(f"returned {len(out)} values for {n} completions")
        except Exception as e:  # a reward must never stop the run
            report.failures[name] = n
            report.errors[name] = f"{type(e).__name__}: {e}"
            log.warning("reward %r raised on the whole batch (%s); %d samples excluded", name, report.errors[name], n)
            return torch.full((n,), float("nan"))
        vals = []
        bad = 0
        for v in out:
            try:
                f = float(v) if v is not None else math.nan
            except (TypeError, ValueError):
                f = math.nan
            bad += math.isnan(f)
            vals.append(f)
        if bad:
            report.failures[name] = bad
        return torch.tensor(vals, dtype=torch.float32)

    def _combine(self, comps: dict[str, torch.Tensor]) -> torch.Tensor:
        total = None
        for name, _, weight in self.components:
            v = comps[name]
            if self.combine == "normalize_then_sum":
                ok = ~torch.isnan(v)
                if ok.sum() > 1:
                    v = (v - v[ok].mean()) / (v[ok].std() + 1e-6)
            total = weight * v if total is None else total + weight * v  # NaN propagates: excluded
        if self.combine == "sum_then_normalize":
            ok = ~torch.isnan(total)
            if ok.sum() > 1:
                total = (total - total[ok].mean()) / (total[ok].std() + 1e-6)
        return total


def score_rollouts(rollouts, rewards: RewardSet) -> tuple[Any, RewardReport]:
    """Fill `rollouts.rewards` and `rollouts.reward_components`; return (rollouts, report)."""
    ids = [row[m.bool()].tolist() for row, m in zip(rollouts.completion_ids, rollouts.completion_mask)]
    total, comps, report = rewards.score(rollouts.prompts, rollouts.completions, rollouts.columns, ids)
    rollouts.rewards = total
    rollouts.reward_components = comps
    return rollouts, report
