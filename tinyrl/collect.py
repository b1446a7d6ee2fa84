"""Where a training step's batch comes from: phases 1-3 of the loop (generate, reward, shape).

Two collectors behind one call, `collect(state) -> (Rollouts, stats)`, chosen once by
`make_collector` from `rollout.max_staleness`:

- `SyncCollector` (max_staleness 0, the default): B prompts x G samples, generated under the
  current adapter; the step waits for its longest group. With DAPO dynamic sampling it keeps only
  groups whose rewards differ and samples again until there are B or the round cap is reached.
- `tinyrl.inflight.PartialCollector` (max_staleness k >= 1): groups decode in a pool that
  outlives the step; a step trains on B groups that have completed, the others go on decoding under
  the next adapter (partial rollouts with bounded staleness).

Both reward, shape and filter a group the same way (`Shaper`), so a run's rewards and penalties do
not depend on which collector made its batch.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from tinyrl import distributed
from tinyrl.algo import shaping
from tinyrl.rewards.core import RewardSet, score_rollouts
from tinyrl.rollout.base import Rollouts, SamplingParams

log = logging.getLogger("tinyrl")


class Shaper:
    """Phases 2-3 for a finished batch of whole groups: rewards, DAPO's overlong penalty, and the
    dynamic-sampling filter."""

    def __init__(self, cfg, rewards: RewardSet, sampling: SamplingParams):
        self.cfg, self.rewards, self.sampling = cfg, rewards, sampling

    def reward(self, batch: Rollouts) -> dict[str, float]:
        """Fill the batch's rewards; returns its counts (`RewardReport.counts`: failures, sandbox outcomes)."""
        _, report = score_rollouts(batch, self.rewards)
        return report.counts()

    def shape(self, batch: Rollouts) -> None:
        """DAPO's soft overlong punishment, on the tokens the policy sampled."""
        a = self.cfg.algo
        if a.overlong_buffer > 0:
            pen = shaping.overlong_penalty(batch.completion_lengths, self.sampling.max_new_tokens,
                                           a.overlong_buffer, a.overlong_penalty)
            batch.reward_components["overlong"] = pen
            batch.rewards = batch.rewards + pen

    def keep_informative(self, batch: Rollouts) -> tuple[Rollouts, int]:
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


class SyncCollector:
    """B groups generated under the current adapter; the step waits for all of them."""

    def __init__(self, cfg, engine, prompts, shaper: Shaper, sampling: SamplingParams, dist):
        self.cfg, self.engine, self.prompts, self.shaper, self.sampling, self.dist = \
            cfg, engine, prompts, shaper, sampling, dist

    def collect(self, state, train_version: int | None = None) -> tuple[Rollouts, dict]:
        """B groups: generate, reward, shape; with dynamic sampling, keep only groups whose rewards
        differ and sample again until there are B or the round cap is reached. (`train_version`: every
        token is sampled by the current adapter; the caller stamps versions when they differ.)"""
        cfg = self.cfg
        B, G = cfg.train.prompts_per_step, cfg.rollout.num_generations
        kept: list[Rollouts] = []
        n_kept = dropped = rounds = 0
        counts: dict[str, float] = {}  # failed samples per reward; what the rewards tallied (sandbox outcomes)
        while True:
            first, rows = self.prompts.take(B - n_kept)  # [dist] this rank's share; `first`: its stream position
            local = 0
            if rows:  # [dist] in a late dynamic-sampling round a rank may get no prompt
                batch = self.generate(state, rows, G, stream=first)  # 1
                add_counts(counts, self.shaper.reward(batch))  # 2
                self.shaper.shape(batch)  # 3
                last_full = batch
                if cfg.algo.dynamic_sampling:
                    batch, n_dropped = self.shaper.keep_informative(batch)
                    dropped += n_dropped
                if batch.num_rows:
                    kept.append(batch)
                    local = int(batch.group.max()) + 1
            rounds += 1
            n_kept += int(self.dist.all_reduce_sum(local))  # [dist] every rank agrees when the batch is full
            if not cfg.algo.dynamic_sampling or n_kept >= B or rounds > cfg.algo.max_sampling_rounds:
                break
        # No informative group at all within the cap: train on the last batch (all advantages 0).
        batch = Rollouts.concat(kept) if kept else last_full if n_kept == 0 else last_full.select([])
        return batch, {"dynamic_dropped_groups": int(self.dist.all_reduce_sum(dropped)), "sampling_rounds": rounds,
                       **count_stats(self.dist, counts)}

    def generate(self, state, rows: list[dict], n: int, stream: int | None = None) -> Rollouts:
        """n samples of each row's prompt. On an out-of-memory error the prompts go to the engine in
        halves (whole groups each; the cap stays for the run, in `state.rollout_prompts`) and are
        sampled again. `stream`: the first row's position in the prompt stream, which seeds its
        samples (the same in any split)."""
        at = lambda i: self.sampling if stream is None else replace(self.sampling, stream=stream + i)  # noqa: E731
        while True:
            k = state.rollout_prompts or len(rows)
            try:
                parts = [self.engine.generate([r["rendered"] for r in rows[i:i + k]], n=n, params=at(i),
                                              columns=rows[i:i + k]) for i in range(0, len(rows), k)]
                return Rollouts.concat(parts)
            except torch.OutOfMemoryError:
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if k == 1:
                    raise
                state.rollout_prompts = (k + 1) // 2
                state.oom_retries += 1
                log.warning("out of memory in the rollout: %d prompts (x %d samples) per engine call from now on; "
                            "sampling again", state.rollout_prompts, n)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def staleness_stats(batch: Rollouts, version: int, max_staleness: int) -> dict[str, float]:
    """How many policy versions old the batch's sampled tokens are when the update at `version` trains on
    them: mean, max, and the share of tokens at each lag 0..max_staleness (`staleness/<lag>`)."""
    if batch.versions is None or not batch.num_rows:
        return {}
    m = batch.action_mask.bool()
    lag = (version - batch.versions)[m]
    if not lag.numel():
        return {}
    out = {"staleness_mean": float(lag.double().mean()), "staleness_max": int(lag.max())}
    for d in range(max_staleness + 1):
        out[f"staleness/{d}"] = float((lag == d).double().mean())
    return out

