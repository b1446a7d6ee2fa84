"""Partial rollouts with bounded staleness (tinyrl.sources.partial): version accounting and the drop rule on
a hand-made schedule, whole groups only, the real engine in a training run, and kill -9 mid-run."""

from __future__ import annotations

import contextlib
import importlib
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from tests.test_resume import kill_9_after_first_checkpoint, overrides
from tinyrl.api import build_trainer
from tinyrl.config import RunConfig
from tinyrl.config.schema import RewardSpec
from tinyrl.data import PromptSource
from tinyrl.distributed import Dist
from tinyrl.rewards.core import RewardSet
from tinyrl.rollout.base import Rollouts, Sample, SamplingParams
from tinyrl.rollout.engine import SamplingEngine
from tinyrl.sources import PartialSource, Shaper, StepInput, staleness_stats

ASSETS = Path(__file__).resolve().parents[1] / "tinyrl" / "assets"


class ScriptedSession:
    """A decode session whose rows emit one token per step: a context whose prompt reads "L<k>" emits
    k tokens ("a"), the last one EOS. The schedule is the test's, not a model's."""

    def __init__(self, tok, log):
        self.tok, self.rows, self.log = tok, [], log

    def __len__(self):
        return len(self.rows)

    def add(self, key, context, max_new, n=1, stream=None):
        text = self.tok.decode(context)
        total = int(text.split("L")[1].split(";")[0])
        already = text.count("a", text.index(";"))  # the tokens it already has (a continued row)
        for j in range(n):
            self.rows.append([key, j, [], total - already])
        self.log.append(("add", key, already))

    def step(self):
        a, eos = self.tok.convert_tokens_to_ids("a"), self.tok.eos_token_id
        out, keep = [], []
        for r in self.rows:
            r[3] -= 1
            r[2].append(eos if r[3] == 0 else a)
            (out if r[3] == 0 else keep).append(r)
        self.rows = keep
        return [(k, j, Sample(ids, [-0.5] * len(ids), "eos")) for k, j, ids, _ in out]

    def pause(self):
        out = [(k, j, Sample(ids, [-0.5] * len(ids), "paused")) for k, j, ids, _ in self.rows]
        self.rows = []
        return out


class ScriptedEngine(SamplingEngine):
    def __init__(self, tok, session_cls=ScriptedSession):
        self.tokenizer, self.log, self.session_cls = tok, [], session_cls

    def session(self, params, greedy=False):
        return contextlib.nullcontext(self.session_cls(self.tokenizer, self.log))


def scripted_collector(lengths, B=2, pool=3, k=1, G=2, reward="tests.test_training:reward_by_length",
                       combine="sum", session_cls=ScriptedSession):
    tok = AutoTokenizer.from_pretrained(ASSETS / "tiny-arith")
    cfg = RunConfig()
    cfg.train.prompts_per_step, cfg.rollout.num_generations = B, G
    cfg.rollout.max_staleness, cfg.rollout.inflight_groups = k, pool
    rows = [{"rendered": f"L{n};", "i": i} for i, n in enumerate(lengths)]
    prompts = PromptSource(rows, seed=0)
    prompts._order = lambda epoch: list(range(len(rows)))  # the schedule's order, not a shuffle
    sampling = SamplingParams(max_new_tokens=64)
    shaper = Shaper(RewardSet([RewardSpec(reward)], combine=combine, isolate=False), sampling)
    engine = ScriptedEngine(tok, session_cls)
    return Scripted(PartialSource(engine, prompts, shaper, Dist()), cfg), engine


class Scripted:
    """The source, and the config the trainer would hand it each step."""

    def __init__(self, source: PartialSource, cfg):
        self.source, self.cfg = source, cfg

    def collect(self, state):
        got = self.source.collect(StepInput(self.cfg, state.step))
        return got.batch, got.stats

    def __getattr__(self, name):
        return getattr(self.source, name)


def test_versions_and_the_drop_rule_on_a_hand_made_schedule():
    # prompts in stream order: lengths 2, 2, 9, 3, 2, 2, 2, 2; B = 2 groups a step, 3 in flight, k = 1
    col, engine = scripted_collector([2, 2, 9, 3, 2, 2, 2, 2])
    state = SimpleNamespace(step=0)
    batch, stats = col.collect(state)  # step 0: groups 0, 1 finish at decode step 2; 2 (len 9) is paused
    assert sorted({r["i"] for r in batch.columns}) == [0, 1]
    assert stats["carried_groups"] == 1 and stats["stale_dropped_groups"] == 0
    assert batch.versions.tolist() == [[0, 0]] * 4 and stats["staleness_max"] == 0
    assert [t.versions for t in col.pool[0].members] == [[0, 0]] * 2  # 2 tokens under version 0

    state.step = 1  # group 2 continues under version 1 beside new groups 3 (len 3) and 4 (len 2)
    batch, stats = col.collect(state)
    assert sorted({r["i"] for r in batch.columns}) == [3, 4]
    assert [t.versions for t in col.pool[0].members][0] == [0, 0, 1, 1, 1]
    assert ("add", ("t", 0), 2) in engine.log  # it continued from its 2 tokens, not from scratch

    state.step = 2  # group 2's oldest token is 2 versions old now: dropped before decoding, and counted
    batch, stats = col.collect(state)
    assert stats["stale_dropped_groups"] == 1
    assert 2 not in {r["i"] for r in batch.columns} and all(g.stream != 2 for g in col.pool)


def test_groups_are_never_split_and_lags_are_counted():
    col, _ = scripted_collector([2, 5, 3, 2, 6, 2, 4, 2, 3, 2, 2, 5, 2, 3, 2, 2, 4, 2], B=2, pool=4, k=3, G=3)
    state = SimpleNamespace(step=0)
    seen = []
    for step in range(5):
        state.step = step
        batch, stats = col.collect(state)
        assert batch.group.tolist() == [0, 0, 0, 1, 1, 1]  # whole groups of G, B of them
        for g in range(2):
            rows = [batch.columns[i]["i"] for i in range(6) if batch.group[i] == g]
            assert len(set(rows)) == 1
            seen.append(rows[0])
        lag = (step - batch.versions)[batch.action_mask.bool()]
        assert stats["staleness_max"] == int(lag.max()) <= 3
        assert sum(stats[f"staleness/{d}"] for d in range(4)) == pytest.approx(1.0)
    assert len(seen) == len(set(seen))  # no group trained twice


def test_staleness_stats_by_hand():
    col, _ = scripted_collector([2, 2, 2])
    batch, _ = col.collect(SimpleNamespace(step=0))
    batch.versions[:2] = 3  # two rows sampled at version 3, two at 0; trained at version 4
    s = staleness_stats(batch, 4, 4)
    assert s["staleness_mean"] == pytest.approx(2.5) and s["staleness_max"] == 4
    assert s["staleness/1"] == pytest.approx(0.5) and s["staleness/4"] == pytest.approx(0.5)


def test_partial_rollouts_train_the_real_engine(tiny_model_dir, run_root):
    o = {**overrides(tiny_model_dir, run_root, "partial"), "rollout.max_staleness": 1, "train.steps": 4,
         "rollout.max_new_tokens": 8, "train.save_every": 0}
    t = build_trainer(overrides=o)
    try:
        assert isinstance(t.source, PartialSource)
        for step in range(4):
            metrics, _ = t.train_step()
            assert metrics["staleness_max"] <= 1 and not metrics["skipped_nonfinite"]
            assert metrics["step"] == step + 1
        assert metrics["carried_groups"] >= 1  # 5 groups in flight (B + 1), 4 trained a step
    finally:
        t.run.unlock()


def test_max_staleness_0_is_the_synchronous_collector(tiny_model_dir, run_root):
    t = build_trainer(overrides=overrides(tiny_model_dir, run_root, "sync"))
    try:
        batch, stats = t.collect_batch()
        assert batch.versions is None and "staleness_mean" not in stats and "carried_groups" not in stats
    finally:
        t.run.unlock()


def test_a_multi_process_launch_resolves():
    from tinyrl.config import load_config

    for o in ({"rollout.max_staleness": 1}, {"rollout.max_staleness": 1, "rollout.overlap": True}):
        load_config("tiny_grpo_cpu", {**o, "dist.nproc": 2})


class ThreadWorld:
    """`n` ranks as threads of this process: a collective waits for every rank's call, then each gets all values."""

    def __init__(self, n: int):
        self.n, self.slots, self.barrier = n, [None] * n, threading.Barrier(n, timeout=60)
        self.calls = [0] * n

    def gather(self, rank: int, obj):
        self.slots[rank] = obj
        self.calls[rank] += 1
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class ThreadDist(Dist):
    def __init__(self, world: ThreadWorld, rank: int):
        super().__init__(torch.device("cpu"))
        self.w, self.rank, self.world = world, rank, world.n

    def _all_reduce(self, t, op):
        vals = self.w.gather(self.rank, t.clone())
        return torch.stack(vals).sum(0) if op == "sum" else torch.stack(vals).amax(0)

    def all_gather_object(self, obj):
        return self.w.gather(self.rank, obj)


def partial_sources(lengths, dists, B=4, pool=6, k=1, G=2, reward="tests.test_training:reward_by_length"):
    """One PartialSource per rank (`dists`) over the same scripted prompt stream; the config each step reads."""
    tok = AutoTokenizer.from_pretrained(ASSETS / "tiny-arith")
    cfg = RunConfig()
    cfg.train.prompts_per_step, cfg.rollout.num_generations = B, G
    cfg.rollout.max_staleness, cfg.rollout.inflight_groups = k, pool
    rows = [{"rendered": f"L{n};", "i": i} for i, n in enumerate(lengths)]
    out = []
    for d in dists:
        prompts = PromptSource(rows, seed=0, rank=d.rank, world=d.world)
        prompts._order = lambda epoch: list(range(len(rows)))  # the schedule's order, not a shuffle
        shaper = Shaper(RewardSet([RewardSpec(reward)], combine="sum", isolate=False), SamplingParams(max_new_tokens=64))
        out.append(PartialSource(ScriptedEngine(tok), prompts, shaper, d))
    return out, cfg


def test_two_ranks_deal_the_groups_one_process_trains_and_keep_in_step():
    lengths = [2, 7, 3, 9, 2, 4, 5, 2, 6, 3, 2, 8, 3, 2, 4, 2, 5, 3, 2, 2, 6, 2, 3, 4]
    (one,), cfg = partial_sources(lengths, [Dist()])
    world = ThreadWorld(2)
    two, _ = partial_sources(lengths, [ThreadDist(world, r) for r in range(2)])
    carried = dropped = 0
    for step in range(5):
        want = one.collect(StepInput(cfg, step))
        got = on_ranks(two, lambda s: s.collect(StepInput(cfg, step)))  # noqa: B023
        streams = lambda c: [r["i"] for j, r in enumerate(c.batch.columns) if j % 2 == 0]  # noqa: E731  (a group's first row)
        assert streams(got[0]) + streams(got[1]) == streams(want)  # the same groups, dealt in stream order
        assert len(streams(got[0])) == len(streams(got[1])) == 2  # whole groups, the same number on each rank
        for key in ("stale_dropped_groups", "carried_groups", "staleness_mean", "staleness_max"):
            assert got[0].stats.get(key) == got[1].stats.get(key) == want.stats.get(key), (step, key)
        both = Rollouts.concat([got[0].batch, got[1].batch])
        assert torch.equal(both.completion_ids, want.batch.completion_ids)
        assert torch.equal(both.versions, want.batch.versions) and torch.equal(both.rewards, want.batch.rewards)
        carried += want.stats["carried_groups"]
        dropped += want.stats["stale_dropped_groups"]
    assert carried and dropped  # the schedule carried groups over and dropped stale ones
    assert world.calls[0] == world.calls[1]  # every collective paired
    states = on_ranks(two, lambda s: s.state_dict())  # a collective too
    assert states[0] == states[1] == one.state_dict()  # every rank's in-flight groups, as one process holds them


def on_ranks(sources, fn):
    """`fn(source)` on each rank's thread at once (their collectives pair up); the results in rank order."""
    got: list = [None] * len(sources)
    threads = [threading.Thread(target=lambda r=r: got.__setitem__(r, fn(sources[r]))) for r in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(g is not None for g in got), "a rank did not finish"
    return got


@pytest.mark.slow
def test_kill_9_during_partial_rollouts_resumes_with_nothing_half_trained(tiny_model_dir, run_root):
    o = {**overrides(tiny_model_dir, run_root, "killed"), "rollout.max_staleness": 1}
    run, saved = kill_9_after_first_checkpoint(o)
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(1, o["train.steps"] + 1))  # neither duplicated nor missing
    first_after = metrics[saved]  # the resumed run's first step: its in-flight groups were sampled again
    assert first_after["staleness_max"] == 0


class SeamSession:
    """A row that writes "1+" before the pause and "=5" + EOS after it: the stop string "+=" spans the pause."""

    def __init__(self, tok, pieces):
        self.tok, self.pieces, self.rows = tok, pieces, []

    def __len__(self):
        return len(self.rows)

    def add(self, key, context, max_new, n=1, stream=None):
        self.rows += [(key, j) for j in range(n)]

    def step(self):  # one piece a step: a "paused" piece stays in the batch until `pause`
        text, finish = self.pieces.pop(0)
        ids = self.tok(text, add_special_tokens=False)["input_ids"] + ([self.tok.eos_token_id] if finish == "eos" else [])
        out = [(k, j, Sample(ids, [-0.25] * len(ids), finish)) for k, j in self.rows]
        if finish == "paused":
            self.held = out
            return []
        self.rows = []
        return out

    def pause(self):
        out, self.held, self.rows = self.held, [], []
        return out


def test_a_stop_string_split_by_a_pause_ends_the_turn_where_an_unpaused_row_would():
    from tinyrl.rollout.base import StopStrings
    from tinyrl.rollout.episodes import EpisodeRunner, PlainTurns

    tok = AutoTokenizer.from_pretrained(ASSETS / "tiny-arith")
    rules = PlainTurns(tok)
    runner = EpisodeRunner(rules, 16, stops=StopStrings(tok, ["+="]))
    t = rules.start(tok("L;", add_special_tokens=False)["input_ids"], {})
    session = SeamSession(tok, [("1+", "paused"), ("=5", "eos")])
    assert runner.run(session, [[t]], until=lambda: True)  # paused after "1+"
    assert not t.done and tok.decode(t.ids) == "1+"
    assert not runner.run(session, [[t]])  # continued under the next adapter
    assert tok.decode(t.ids) == "1+=" and len(t.logprobs) == len(t.versions) == 3 and t.done


SCORED = threading.Event()


def length_reward_that_signals(prompts, completions, **kw):
    SCORED.set()
    return [float(len(c)) for c in completions]


def scored():
    """The event of the module copy the reward is resolved from ("tests.test_partial_rollouts"; pytest
    may have imported this file under another name)."""
    return importlib.import_module("tests.test_partial_rollouts").SCORED


class WaitingSession(ScriptedSession):
    """At its 5th decode step (the long group still decoding) it waits up to 10 s for a reward call and
    logs whether one came: it can only come from a worker scoring the group that finished at step 2."""

    steps = 0

    def step(self):
        self.steps += 1
        if self.steps == 5:
            self.log.append(("scored while decoding", scored().wait(10)))
        return super().step()


def test_rewards_of_a_finished_group_run_while_the_pool_decodes_on():
    scored().clear()
    col, engine = scripted_collector([2, 9], B=2, pool=2, reward="tests.test_partial_rollouts:length_reward_that_signals",
                                     session_cls=WaitingSession)
    batch, stats = col.collect(SimpleNamespace(step=0))
    assert ("scored while decoding", True) in engine.log
    assert [r["i"] for r in batch.columns] == [0, 0, 1, 1]  # in the order the groups were pooled
    assert batch.rewards.tolist() == [float(len(c)) for c in batch.completions] and batch.group.tolist() == [0, 0, 1, 1]
    assert batch.completion_lengths.tolist() == [2, 2, 9, 9]


def test_a_normalising_reward_combine_scores_the_whole_batch_at_once():
    col, _ = scripted_collector([2, 9], B=2, pool=2, combine="normalize_then_sum")
    batch, _ = col.collect(SimpleNamespace(step=0))
    assert col.scorer is None
    r = batch.rewards  # normalised over the batch: each group's 2 equal lengths would give 0 alone
    assert float(r.mean()) == pytest.approx(0.0, abs=1e-5) and r[0] < 0 < r[2]


class TightSession(ScriptedSession):
    """"A card" that decodes at most 4 rows at once: a step over more runs out of memory."""

    def step(self):
        if len(self.rows) > 4:
            self.log.append(("oom", len(self.rows)))
            raise torch.OutOfMemoryError("out of memory (injected by the test)")
        return super().step()


def test_out_of_memory_in_the_pool_decodes_fewer_groups_at_once_and_keeps_the_cap():
    col, engine = scripted_collector([2, 3, 9, 2, 2, 2, 2, 2], B=2, pool=3, G=2, session_cls=TightSession)
    got = col.source.collect(StepInput(col.cfg, 0))  # 3 groups x 2 rows = 6 rows: out of memory, then 2 at a time
    assert [e for e in engine.log if e[0] == "oom"] == [("oom", 6)]
    assert (got.rollout_prompts, got.oom_retries) == (2, 1)
    assert got.batch.group.tolist() == [0, 0, 1, 1] and sorted({r["i"] for r in got.batch.columns}) == [0, 1]
    again = col.source.collect(StepInput(col.cfg, 1, rollout_prompts=got.rollout_prompts))  # the cap, kept
    assert [e for e in engine.log if e[0] == "oom"] == [("oom", 6)] and again.oom_retries == 0
