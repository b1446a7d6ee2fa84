"""What every batch source shares: a step's input and its result, the rewards and shaping of whole
groups (`Shaper`), and the dynamic-sampling round loop (`gather`), written once.

A source owns no run state. Each step the trainer hands it a `StepInput` (the run's current config,
the monitor's patches applied; the policy version; the rollout's out-of-memory cap) and gets back a
`Collected`: the batch, its statistics, and what changed (the cap after an out-of-memory retry). The
trainer's `TrainerState` is the one owner of what changes as a run trains.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tinyrl import distributed
from tinyrl.algo import shaping
from tinyrl.rewards.core import RewardSet, score_rollouts
from tinyrl.rollout.base import Rollouts, SamplingParams

log = logging.getLogger("tinyrl")


@dataclass(frozen=True)
class StepInput:
    """What a source reads for one step's batch."""

    cfg: Any  # the RunConfig as it is now: the resolved config with the monitor's patches applied
    version: int  # the policy version that samples now (optimiser steps taken)
    rollout_prompts: int | None = None  # prompts per engine call since an out-of-memory error (None: all)
    train_version: int | None = None  # the version whose update trains on the batch (None: `version`)

    @property
    def trained_at(self) -> int:
        return self.version if self.train_version is None else self.train_version


@dataclass
class Collected:
    """A step's batch of whole groups, its statistics, and what the collection changed."""

    batch: Rollouts
    stats: dict
    rollout_prompts: int | None = None  # the out-of-memory cap the collection ended with
    oom_retries: int = 0  # out-of-memory retries it took
    cfg: Any = None  # the config it collected with (one-step-off: the config when the collection began)


@dataclass
class OomCap:
    """Prompts (groups) per engine call or decode session after an out-of-memory error (None: all of them),
    and the retries one collection took to find it."""

    prompts: int | None
    retries: int = 0

    def halve(self, k: int, what: str) -> None:
        """Out of memory with `k` at once: half as many from now on (ConfigError-free: the caller re-raises at 1)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.prompts, self.retries = (k + 1) // 2, self.retries + 1
        log.warning("out of memory in the rollout: %d %s at once from now on; sampling again", self.prompts, what)


class Shaper:
    """Phases 2-3 for a finished batch of whole groups: rewards, DAPO's overlong penalty, and the
    dynamic-sampling filter. It holds the run's reward set and sampling settings, never a config: the
    algorithm's switches come with each call."""

    def __init__(self, rewards: RewardSet, sampling: SamplingParams):
        self.rewards, self.sampling = rewards, sampling

    def reward(self, batch: Rollouts) -> dict[str, float]:
        """Fill the batch's rewards; returns its counts (`RewardReport.counts`: failures, sandbox outcomes)."""
        _, report = score_rollouts(batch, self.rewards)
        return report.counts()

    def shape(self, batch: Rollouts, algo) -> None:
        """DAPO's soft overlong punishment, on the tokens the policy sampled."""
        if algo.overlong_buffer > 0:
            pen = shaping.overlong_penalty(batch.completion_lengths, self.sampling.max_new_tokens,
                                           algo.overlong_buffer, algo.overlong_penalty)
            batch.reward_components["overlong"] = pen
            batch.rewards = batch.rewards + pen


def keep_informative(batch: Rollouts) -> tuple[Rollouts, int]:
    """DAPO dynamic sampling: the batch without its groups of identical rewards, and how many went."""
    informative = shaping.informative_groups(batch.rewards, batch.group)
    if informative.all():
        return batch, 0
    return batch.select(torch.nonzero(informative[batch.group]).squeeze(-1)), int((~informative).sum())


def add_counts(total: dict[str, float], counts: dict[str, float]) -> None:
    for k, v in counts.items():
        total[k] = total.get(k, 0) + v


def count_stats(dist, counts: dict[str, float]) -> dict[str, float]:
    """The reward counts of a step summed over ranks, with their failure total."""
    counts = distributed.sum_counts(dist, counts)  # [dist]
    return {"reward_failures": sum(v for k, v in counts.items() if k.startswith("reward_failures/")), **counts}


Draw = Callable[[int], "tuple[Rollouts, dict] | None"]


def gather(cfg, dist, shaper: Shaper, draw: Draw) -> tuple[Rollouts, dict]:
    """B groups for a step (train.prompts_per_step over every rank). `draw(need)` returns up to `need`
    (global count) more whole groups of this rank, rewarded, with their reward counts (None: none for this
    rank this round). Each is shaped; with algo.dynamic_sampling only groups whose rewards differ are kept,
    and `draw` is called again until B were kept or algo.max_sampling_rounds extra rounds were taken. No
    informative group at all within the cap: the step trains on the last batch drawn (all advantages 0)."""
    B, algo = cfg.train.prompts_per_step, cfg.algo
    kept: list[Rollouts] = []
    last = None
    n_kept = dropped = rounds = 0
    counts: dict[str, float] = {}  # failed samples per reward; what the rewards tallied (sandbox outcomes)
    while True:
        drawn = draw(B - n_kept)
        local = 0
        if drawn is not None:  # [dist] in a late dynamic-sampling round a rank may get no prompt
            batch, c = drawn
            add_counts(counts, c)
            shaper.shape(batch, algo)
            last = batch
            if algo.dynamic_sampling:
                batch, n = keep_informative(batch)
                dropped += n
            if batch.num_rows:
                kept.append(batch)
                local = int(batch.group.max()) + 1
        rounds += 1
        n_kept += int(dist.all_reduce_sum(local))  # [dist] every rank agrees when the batch is full
        if not algo.dynamic_sampling or n_kept >= B or rounds > algo.max_sampling_rounds:
            break
    batch = Rollouts.concat(kept) if kept else last if n_kept == 0 else last.select([])
    return batch, {"dynamic_dropped_groups": int(dist.all_reduce_sum(dropped)), "sampling_rounds": rounds,
                   **count_stats(dist, counts)}


def staleness_stats(batch: Rollouts, version: int, max_staleness: int, dist=None) -> dict[str, float]:
    """How many policy versions old the batch's sampled tokens are when the update at `version` trains on
    them: mean, max, and the share of tokens at each lag 0..max_staleness (`staleness/<lag>`; the config
    bounds max_staleness, so the columns are few). [dist] With `dist`, over every rank's batch (a collective)."""
    lag = torch.zeros(0, dtype=torch.long)
    if batch.versions is not None and batch.num_rows:
        lag = (version - batch.versions)[batch.action_mask.bool()]
    counts = torch.bincount(lag.clamp(min=0), minlength=max_staleness + 1)[: max_staleness + 1]
    mine = {"n": lag.numel(), "sum": int(lag.sum()), "lags": counts.tolist(), "max": int(lag.max()) if lag.numel() else 0}
    parts = [mine] if dist is None else dist.all_gather_object(mine)  # [dist]
    n = sum(p["n"] for p in parts)
    if not n:
        return {}
    out = {"staleness_mean": sum(p["sum"] for p in parts) / n, "staleness_max": max(p["max"] for p in parts if p["n"])}
    for d in range(max_staleness + 1):
        out[f"staleness/{d}"] = sum(p["lags"][d] for p in parts) / n
    return out
