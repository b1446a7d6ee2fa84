"""Partial rollouts with bounded staleness (`rollout.max_staleness: k >= 1`).

A synchronous step waits for its longest group: with a long tail of completion lengths (a tenth of
the prompts asking for answers 4x longer) most of the step's rollout time decodes a few rows. Here
groups live in a pool that outlives the step (`rollout.inflight_groups`, default B + B//4):

    1. top the pool up with new prompts (whole groups of G samples);
    2. decode the pool (tinyrl.rollout.episodes) until B groups have completed; pause the rest;
    3. train on B completed groups, the oldest first (rewarded, shaped, filtered as a synchronous
       batch is: tinyrl.sources.base). A group's rewards are computed on a worker thread as soon as
       its last member finishes, while the pool decodes on (with `reward.combine: sum`, the default;
       the normalising combines need the whole batch, which is then scored at once);
    4. the paused groups continue at the next step, under the next adapter, from their tokens so far.

A group is never split across steps. Each sampled token records the policy version (optimiser steps
taken) that sampled it; at the step with policy version v, a group holding a token older than v - k
is dropped and counted (`stale_dropped_groups`). The loss sees the mix of behaviour policies through
the engine's logprobs (`sampling_logprobs`); `algo.off_policy` chooses the correction.

N processes (`dist.nproc > 1`): each rank decodes its own share of the pool (new groups go to the rank holding
the fewest), and the ranks decide together what one process would decide alone: they decode in step until the
pool of every rank together holds `need` completed groups (one all-reduce of a count per decode step), the
completed groups with the lowest prompt-stream positions train, and they are dealt to the ranks as a synchronous
batch is (rank r takes the r-th contiguous share, whole groups, the same number on every rank), so a group
decoded on one rank may train on another (its tokens and rewards travel, once). A row that continues after a
pause draws from a generator keyed by its group's prompt position, its member index and its tokens so far, not
from a generator it shares with the rest of its decode session: with the per-prompt streams of new groups, a
row's draws depend on no other row, so N processes train on the groups one process trains on (to fp32 rounding
of the decode; tests/test_distributed.py). The staleness rule reads only the group and the policy version: the
same on every rank.

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

import torch

from tinyrl.distributed import shard
from tinyrl.rollout.base import Rollouts, StopStrings, stream_seed
from tinyrl.rollout.episodes import EpisodeRunner, Trajectory
from tinyrl.sources.base import Collected, OomCap, Shaper, StepInput, add_counts, gather, staleness_stats

log = logging.getLogger("tinyrl")


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


def pool_size(cfg) -> int:
    """Groups in flight: rollout.inflight_groups, default B + B//4; never under B (it could not fill a step)."""
    B = cfg.train.prompts_per_step
    return max(cfg.rollout.inflight_groups or B + max(1, B // 4), B)


class PartialSource:
    """Groups decode in a pool across steps; a step trains on B groups that completed."""

    def __init__(self, engine, prompts, shaper: Shaper, dist, tool_workers: int = 8):
        self.engine, self.prompts, self.shaper, self.dist = engine, prompts, shaper, dist
        self.episodes = engine.episodes(shaper.sampling)  # the turn rules (single-turn or a tool agent)
        # a group scores alone (as soon as it completes) when the total is a plain sum of its rows' rewards
        self.scorer = ThreadPoolExecutor(1, thread_name_prefix="tinyrl-reward") \
            if shaper.rewards.combine == "sum" else None
        if self.scorer is not None:
            shaper.rewards.start()  # fork the rewards' process here, before any worker thread exists
        self.runner = _Runner(self.episodes.rules, shaper.sampling.max_new_tokens, tool_workers,
                              StopStrings(engine.tokenizer, self.episodes.params.stop),
                              on_done=self._finished if self.scorer is not None else None)
        self.runner.stream_of = self._continued_stream
        self.owner: dict[int, Group] = {}  # id(trajectory) -> its group, for the groups decoding now
        self.pool: list[Group] = []
        self.requeue: list[int] = []  # prompt-stream positions to start again first (a resumed run's in-flight groups)

    def collect(self, inp: StepInput) -> Collected:
        """B completed groups, sampled under policy version `inp.version` (and earlier, carried), for the
        update at `inp.trained_at` (one-step-off: the next version)."""
        cfg, v, vt = inp.cfg, inp.version, inp.trained_at
        k = cfg.rollout.max_staleness
        # decoding below adds only version-v tokens (v >= vt - k)
        dropped_stale = int(self.dist.all_reduce_sum(self._drop_stale(vt - k)))  # [dist]
        cap = OomCap(inp.rollout_prompts)

        def draw(need: int):
            self._top_up(cfg)
            self._decode(v, need, cap)
            return self._deal(need)

        batch, stats = gather(cfg, self.dist, self.shaper, draw)
        stats.update({"stale_dropped_groups": dropped_stale,
                      "carried_groups": int(self.dist.all_reduce_sum(len(self.pool))),  # [dist]
                      **staleness_stats(batch, vt, k, self.dist)})
        return Collected(batch, stats, cap.prompts, cap.retries, cfg)

    def _decode(self, version: int, need: int, cap: OomCap) -> None:
        """Decode the pool's unfinished groups (at most `cap.prompts` of them in one decode session) until every
        rank's pool together holds `need` done groups. Out of memory: the groups of that session start again from
        their prompts (a session that died mid-step leaves a tool episode half-observed), with half as many groups
        a session from then on.

        [dist] The count is an all-reduce after every decode step of every rank (`reached`); a rank whose groups
        are all done keeps answering it until the others are through, so every rank makes the same calls."""
        ep = self.episodes
        last = [self._reached(need)]

        def until() -> bool:
            last[0] = self._reached(need)
            return last[0]

        while not last[0]:
            live = [g for g in self.pool if not g.done]
            if not live:  # [dist] this rank is through; the others decode on
                until()
                continue
            chunk = live[:cap.prompts or len(live)]
            try:
                with ep.sampler.session(ep.params) as session:
                    self.owner = {id(t): g for g in chunk for t in g.members}
                    self.runner.run(session, [g.members for g in chunk], [g.stream for g in chunk], version=version,
                                    until=until)  # its last call after the session's last step: `last` is current
            except torch.OutOfMemoryError:
                if len(chunk) == 1:
                    raise
                for g in chunk:
                    if not g.done:
                        g.members = [ep.rules.start(g.members[0].prompt_ids, g.members[0].row) for _ in g.members]
                cap.halve(len(chunk), "groups per decode session")

    def _reached(self, need: int) -> bool:
        return self.dist.all_reduce_sum(sum(g.done for g in self.pool)) >= need  # [dist] every rank's pool

    def _deal(self, need: int) -> tuple[Rollouts, dict] | None:
        """The `need` done groups (of every rank's pool) with the lowest prompt-stream positions leave the pools,
        rewarded; this rank's contiguous share of them, in stream order (None: no group for this rank)."""
        done = sorted(s for part in self.dist.all_gather_object([g.stream for g in self.pool if g.done])  # [dist]
                      for s in part)
        chosen = set(done[:need])
        mine = [g for g in self.pool if g.stream in chosen]
        self.pool = [g for g in self.pool if g.stream not in chosen]
        # [dist] groups move to the rank that trains them (one process: its own, in stream order)
        dealt = sorted((x for part in self.dist.all_gather_object(self._payloads(mine)) for x in part),
                       key=lambda x: x[0])[shard(len(chosen), self.dist.rank, self.dist.world)]
        if not dealt:
            return None
        if self.scorer is None:  # a normalising combine: this rank's share scored as one batch
            batch = Rollouts.concat([b for _, b, _ in dealt])
            return batch, self.shaper.reward(batch)
        counts: dict[str, float] = {}
        for _, _, c in dealt:
            add_counts(counts, c)
        return Rollouts.concat([b for _, b, _ in dealt]), counts

    def _payloads(self, groups: list[Group]) -> list[tuple[int, Rollouts, dict | None]]:
        """(stream position, the group's batch, its reward counts: rewarded already with `reward.combine: sum`)."""
        if self.scorer is None:
            return [(g.stream, self._pack([g]), None) for g in groups]
        return [(g.stream, *(g.scored if g.scored is not None else self._score(g)).result()) for g in groups]

    def _top_up(self, cfg) -> None:
        """New groups (resumed in-flight prompts first) until the pool holds its size. [dist] The pool is every
        rank's together; each new group goes to the rank holding the fewest (the lowest rank on a tie)."""
        G, size = cfg.rollout.num_generations, pool_size(cfg)
        held = self.dist.all_gather_object(len(self.pool))  # [dist]
        for _ in range(size - sum(held)):
            pos = self.requeue.pop(0) if self.requeue else self.prompts.take(1)[0]  # [dist] every rank advances
            rank = min(range(len(held)), key=lambda r: (held[r], r))
            held[rank] += 1
            if rank == self.dist.rank:
                row = self.prompts.row_at(pos)
                ids = self.engine.tokenizer([row["rendered"]], add_special_tokens=False)["input_ids"][0]
                self.pool.append(Group(pos, [self.episodes.rules.start(ids, row) for _ in range(G)]))

    def _continued_stream(self, t: Trajectory) -> int:
        """The sample stream of a row that continues (after a pause, or a tool's observation): keyed by its group's
        prompt position, its member index and its tokens so far, so its draws depend on no other row."""
        g = self.owner[id(t)]
        j = next(i for i, m in enumerate(g.members) if m is t)
        return stream_seed("continued", g.stream, j, len(t.ids))

    def _finished(self, t: Trajectory) -> None:
        """A trajectory finished (on the decoding thread): a group whose last member it was goes to be scored."""
        g = self.owner.get(id(t))
        if g is not None and g.scored is None and g.done:
            g.scored = self._score(g)

    def _score(self, g: Group) -> Future:
        batch = self._pack([g])  # on this thread: the tokenizer stays on one thread
        return self.scorer.submit(lambda: (batch, self.shaper.reward(batch)))

    def _drop_stale(self, oldest_allowed: int) -> int:
        """Drop the groups holding a token sampled before policy version `oldest_allowed`."""
        stale = [g for g in self.pool if (o := g.oldest()) is not None and o < oldest_allowed]
        self.pool = [g for g in self.pool if g not in stale]
        if stale:
            log.debug("partial rollouts: %d group(s) dropped, sampled before policy version %d", len(stale),
                      oldest_allowed)
        return len(stale)

    def _pack(self, groups: list[Group]) -> Rollouts:
        trajs = [t for g in groups for t in g.members]
        gid = [i for i, g in enumerate(groups) for _ in g.members]
        return self.episodes.rules.pack(trajs, gid, [t.row["rendered"] for t in trajs])

    def state_dict(self) -> dict:
        """The in-flight groups' prompt-stream positions, every rank's: a resumed run samples them again (see
        above). [dist] A collective: every rank calls it (the trainer's checkpoint state, one-step-off's launch)."""
        pooled = sorted(s for part in self.dist.all_gather_object([g.stream for g in self.pool]) for s in part)
        return {"inflight": self.requeue + pooled}

    def load_state_dict(self, state: dict) -> None:
        self.pool, self.requeue = [], list(state.get("inflight", []))


class _Runner(EpisodeRunner):
    """The episode loop of the pool: a row that joins again (continues after a pause or a tool's observation) draws
    from its own stream (`stream_of(trajectory)`), not from its session's shared generator."""

    stream_of = None

    def _join(self, session, i: int, t: Trajectory) -> None:
        session.add(("t", i), t.prompt_ids + t.ids, self.budget - len(t.ids), n=1, stream=self.stream_of(t))
