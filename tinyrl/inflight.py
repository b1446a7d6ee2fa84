"""Partial rollouts with bounded staleness (`rollout.max_staleness: k >= 1`).

A synchronous step waits for its longest group: with a long tail of completion lengths (a tenth of
the prompts asking for answers 4x longer) most of the step's rollout time decodes a few rows. Here
groups live in a pool that outlives the step (`rollout.inflight_groups`, default B + B//4):

    1. top the pool up with new prompts (whole groups of G samples);
    2. decode the pool (tinyrl.rollout.episodes) until B groups have completed; pause the rest;
    3. train on B completed groups, the oldest first (rewarded, shaped, filtered as a synchronous
       batch is: tinyrl.collect.Shaper). A group's rewards are computed on a worker thread as soon as
       its last member finishes, while the pool decodes on (with `reward.combine: sum`, the default;
       the normalising combines need the whole batch, which is then scored at once);
    4. the paused groups continue at the next step, under the next adapter, from their tokens so far.

A group is never split across steps. Each sampled token records the policy version (optimiser steps
taken) that sampled it; at the step with policy version v, a group holding a token older than v - k
is dropped and counted (`stale_dropped_groups`). The loss sees the mix of behaviour policies through
the engine's logprobs (`sampling_logprobs`); `algo.off_policy` chooses the correction.

Checkpoints re-sample in-flight groups on resume: they save each in-flight group's prompt-stream
position (not its tokens), and the resumed run starts those prompts again first. A trajectory halfway
through a tool episode holds its environment's state (an open sandbox, a browsing session), which
cannot be saved in general; re-sampling loses at most one pool of partial decodes and keeps every
group the resumed run trains on within the staleness bound.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from tinyrl.collect import Shaper, SyncCollector, add_counts, count_stats, staleness_stats
from tinyrl.errors import ConfigError
from tinyrl.overlap import OverlapCollector, detached_engine, shared_base_copy
from tinyrl.rollout.base import Rollouts, SamplingParams, StopStrings
from tinyrl.rollout.episodes import EpisodeRunner, PlainTurns, Trajectory
from tinyrl.rollout.session import session_of

log = logging.getLogger("tinyrl")


def make_collector(cfg, engine, prompts, shaper: Shaper, sampling: SamplingParams, dist, model=None):
    """The run's batch source: synchronous (max_staleness 0), partial rollouts (k >= 1), or one-step-off
    (rollout.overlap, tinyrl.overlap): synchronous batches collected a step ahead on a thread (k = 1), a
    pool of partial rollouts collected a step ahead (k >= 2)."""
    r = cfg.rollout
    if dist.world > 1 and (r.max_staleness or r.overlap):
        raise ConfigError("rollout.max_staleness > 0 and rollout.overlap run on one process for now (the "
                          "processes would each keep a pool they do not balance); set rollout.max_staleness: 0 "
                          "and rollout.overlap: false for a multi-process launch")
    rollout_model = shared_base_copy(model) if r.overlap else None
    if r.overlap:
        engine = detached_engine(engine, rollout_model)
    # one-step-off spends one version of the staleness budget: its batches train one version late, so a
    # pool of partial rollouts beside it needs max_staleness >= 2 (at 1 every carried group would go stale)
    partial = r.max_staleness > (1 if r.overlap else 0)
    inner = (PartialCollector(cfg, engine, prompts, shaper, sampling, dist) if partial
             else SyncCollector(cfg, engine, prompts, shaper, sampling, dist))
    if not r.overlap:
        return inner
    return OverlapCollector(inner, prompts, model, rollout_model, cfg.train.steps, r.max_staleness)


@dataclass
class Group:
    stream: int  # its prompt's position in the run's prompt stream
    members: list[Trajectory]
    scored: Future | None = None  # (its packed batch, reward counts), computing on the reward worker

    @property
    def done(self) -> bool:
        return all(t.done for t in self.members)

    def oldest(self) -> int | None:
        """The oldest policy version among the group's sampled tokens (None: nothing sampled yet)."""
        v = [x for t in self.members for x, o in zip(t.versions, t.obs) if not o]
        return min(v) if v else None


class PartialCollector:
    """Groups decode in a pool across steps; a step trains on B groups that completed."""

    def __init__(self, cfg, engine, prompts, shaper: Shaper, sampling: SamplingParams, dist):
        self.cfg, self.engine, self.prompts, self.shaper, self.sampling = cfg, engine, prompts, shaper, sampling
        self.dist = dist
        B = cfg.train.prompts_per_step
        self.size = max(cfg.rollout.inflight_groups or B + max(1, B // 4), B)  # a pool under B never fills a step
        agent = hasattr(engine, "end_turn")  # a tool agent (tinyrl.rollout.agent) brings its own turn rules
        self.rules = engine if agent else PlainTurns(engine.tokenizer)
        self.sampler = engine.inner if agent else engine
        self.params = engine.turn_params(sampling) if agent else sampling
        # a group scores alone (as soon as it completes) when the total is a plain sum of its rows' rewards
        self.scorer = ThreadPoolExecutor(1, thread_name_prefix="tinyrl-reward") \
            if shaper.rewards.combine == "sum" else None
        if self.scorer is not None:
            shaper.rewards.start()  # fork the rewards' process here, before any worker thread exists
        self.runner = EpisodeRunner(self.rules, sampling.max_new_tokens, getattr(cfg.agent, "tool_workers", 8),
                                    StopStrings(engine.tokenizer, self.params.stop),
                                    on_done=self._finished if self.scorer is not None else None)
        self.owner: dict[int, Group] = {}  # id(trajectory) -> its group, for the groups decoding now
        self.pool: list[Group] = []
        self.requeue: list[int] = []  # prompt-stream positions to start again first (a resumed run's in-flight groups)

    def collect(self, state, train_version: int | None = None) -> tuple[Rollouts, dict]:
        """B completed groups, sampled under policy version `state.step` (and earlier, carried), for the
        update at `train_version` (default: the same version; one-step-off: the next)."""
        cfg, v = self.cfg, state.step
        B, k = cfg.train.prompts_per_step, cfg.rollout.max_staleness
        vt = v if train_version is None else train_version
        parts: list[Rollouts] = []
        counts: dict[str, float] = {}
        n_kept = dropped_dynamic = rounds = 0
        dropped_stale = self._drop_stale(vt - k)  # decoding below adds only version-v tokens (v >= vt - k)
        while True:
            need = B - n_kept
            self._top_up()
            if sum(g.done for g in self.pool) < need:
                with session_of(self.sampler, self.params) as session:
                    live = [g for g in self.pool if not g.done]
                    self.owner = {id(t): g for g in live for t in g.members}
                    self.runner.run(session, [g.members for g in live], [g.stream for g in live], version=v,
                                    until=lambda n=need: sum(g.done for g in self.pool) >= n)
            ready = [g for g in self.pool if g.done][:need]
            self.pool = [g for g in self.pool if g not in ready]
            if ready:
                batch = self._rewarded(ready, counts)
                self.shaper.shape(batch)
                if cfg.algo.dynamic_sampling:
                    batch, n = self.shaper.keep_informative(batch)
                    dropped_dynamic += n
                if batch.num_rows:
                    parts.append(batch)
                    n_kept += int(batch.group.max()) + 1
            rounds += 1
            if not cfg.algo.dynamic_sampling or n_kept >= B or rounds > cfg.algo.max_sampling_rounds:
                break
        batch = Rollouts.concat(parts) if parts else self._pack([])
        return batch, {"dynamic_dropped_groups": dropped_dynamic, "sampling_rounds": rounds,
                       "stale_dropped_groups": dropped_stale, "carried_groups": len(self.pool),
                       **staleness_stats(batch, vt, k), **count_stats(self.dist, counts)}

    def _top_up(self) -> None:
        """New groups (resumed in-flight prompts first) until the pool holds `size` groups."""
        G = self.cfg.rollout.num_generations
        while len(self.pool) < self.size:
            if self.requeue:
                pos = self.requeue.pop(0)
                row = self.prompts.row_at(pos)
            else:
                pos, rows = self.prompts.take(1)
                row = rows[0]
            ids = self.engine.tokenizer([row["rendered"]], add_special_tokens=False)["input_ids"][0]
            self.pool.append(Group(pos, [self.rules.start(ids, row) for _ in range(G)]))

    def _finished(self, t: Trajectory) -> None:
        """A trajectory finished (on the decoding thread): a group whose last member it was goes to be scored."""
        g = self.owner.get(id(t))
        if g is not None and g.scored is None and g.done:
            g.scored = self._score(g)

    def _score(self, g: Group) -> Future:
        batch = self._pack([g])  # on this thread: the tokenizer stays on one thread
        return self.scorer.submit(lambda: (batch, self.shaper.reward(batch)))

    def _rewarded(self, groups: list[Group], counts: dict) -> Rollouts:
        """The groups as one batch with its rewards (each group's, scored as it completed; or all at once)."""
        if self.scorer is None:
            batch = self._pack(groups)
            add_counts(counts, self.shaper.reward(batch))
            return batch
        parts = [(g.scored if g.scored is not None else self._score(g)).result() for g in groups]
        for _, c in parts:
            add_counts(counts, c)
        return Rollouts.concat([b for b, _ in parts])

    def _drop_stale(self, oldest_allowed: int) -> int:
        """Drop the groups holding a token sampled before policy version `oldest_allowed`."""
        stale = [g for g in self.pool if (o := g.oldest()) is not None and o < oldest_allowed]
        self.pool = [g for g in self.pool if g not in stale]
        if stale:
            log.debug("partial rollouts: %d group(s) dropped, older than %d policy versions", len(stale),
                      self.cfg.rollout.max_staleness)
        return len(stale)

    def _pack(self, groups: list[Group]) -> Rollouts:
        trajs = [t for g in groups for t in g.members]
        gid = [i for i, g in enumerate(groups) for _ in g.members]
        return self.rules.pack(trajs, gid, [t.row["rendered"] for t in trajs])

    def state_dict(self) -> dict:
        """The in-flight groups' prompt-stream positions: a resumed run samples them again (see above)."""
        return {"inflight": self.requeue + [g.stream for g in self.pool]}

    def load_state_dict(self, state: dict) -> None:
        self.pool, self.requeue = [], list(state.get("inflight", []))
