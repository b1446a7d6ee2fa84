"""One owner of the run's state (issue 48): the trainer's state holds the monitor's config patches and the
out-of-memory caps; every phase reads the config they imply and hands back what it changed. Each test here
failed before: the batch sources kept the config they were built with (an auto-action never reached them,
before or after a resume), and one-step-off wrote the rollout's OOM cap into a copy of the state."""

from __future__ import annotations

import torch

import tinyrl.trainer as trainer_module
from tinyrl.api import build_trainer
from tinyrl.monitor import Alarm, planned_action
from tinyrl.sources import OverlapSource

CONSTANT = "tests.test_training:constant_reward"  # every group all alike: dynamic sampling drops every one


def small(model, run_root, name, **extra):
    o = {"model.name": model, "log.run_dir": run_root, "log.name": name, "log.progress": False, "train.steps": 3,
         "train.prompts_per_step": 2, "rollout.num_generations": 2, "train.micro_batch_size": 4,
         "rollout.max_new_tokens": 4, "data.num_train": 64, "data.num_eval": 0, "train.save_every": 1,
         "train.eval_before_after": False, "reward.functions": [CONSTANT], "algo.max_sampling_rounds": 1,
         "monitor.auto_dynamic_sampling": True}
    o.update(extra)
    return o


def force_dynamic_sampling(t) -> str:
    """The monitor's advantage-collapse action, taken as the trainer takes it (planned_action -> take)."""
    alarm = Alarm("advantage_collapse", t.state.step, "forced by the test", "", action_key="dynamic_sampling")
    return t.take(planned_action(t.monitor, alarm, t.cfg))


def spy_views(monkeypatch) -> list[tuple[str, bool]]:
    """What each phase saw of algo.dynamic_sampling: the source's input, the update's switches."""
    seen: list[tuple[str, bool]] = []
    real_update = trainer_module.policy_update

    def update(model, optimizer, batch, algo, **kw):
        seen.append(("update", algo.dynamic_sampling))
        return real_update(model, optimizer, batch, algo, **kw)

    monkeypatch.setattr(trainer_module, "policy_update", update)
    return seen


def test_an_auto_action_reaches_the_source_and_the_update_before_and_after_a_resume(tiny_model_dir, run_root,
                                                                                    monkeypatch):
    seen = spy_views(monkeypatch)
    t = build_trainer(overrides=small(tiny_model_dir, run_root, "action"))
    real_collect = t.source.collect

    def collect(inp):
        seen.append(("source", inp.cfg.algo.dynamic_sampling))
        return real_collect(inp)

    t.source.collect = collect
    try:
        m1, _ = t.train_step()
        assert m1["dynamic_dropped_groups"] == 0 and m1["sampling_rounds"] == 1  # off: nothing dropped
        assert "turned on algo.dynamic_sampling" in force_dynamic_sampling(t)
        assert t.cfg.algo.dynamic_sampling and not t.base_cfg.algo.dynamic_sampling
        m2, _ = t.train_step()
        # on: both groups of each round were all alike, dropped, sampled again up to the round cap
        assert m2["dynamic_dropped_groups"] == 4 and m2["sampling_rounds"] == 2
        assert seen == [("source", False), ("update", False), ("source", True), ("update", True)]
        t.save_checkpoint()
    finally:
        t.run.unlock()

    seen.clear()
    resumed = build_trainer(resume=t.run.path)  # the patch comes back with the checkpoint's state
    try:
        assert resumed.state.config_patches == {"algo.dynamic_sampling": True}
        assert resumed.cfg.algo.dynamic_sampling
        m3, _ = resumed.train_step()
        assert m3["step"] == 3 and m3["dynamic_dropped_groups"] == 4
        assert seen == [("update", True)]
    finally:
        resumed.run.unlock()


def test_one_step_off_keeps_the_rollout_oom_cap(tiny_model_dir, run_root):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, "overlap-oom", **{
        "rollout.max_staleness": 1, "rollout.overlap": True, "train.save_every": 0, "train.prompts_per_step": 4,
        "reward.functions": ["tests.test_training:reward_by_length"], "monitor.auto_dynamic_sampling": False}))
    assert isinstance(t.source, OverlapSource)
    engine = t.source.inner.engine  # the rollout copy's engine (it samples on the worker thread)
    real, raised = engine.generate, []

    def tight(prompts, n, params, columns=None, greedy=False):  # "a card" that holds 2 prompts x 2 samples
        if len(prompts) * n > 4:
            raised.append(len(prompts))
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(prompts, n, params, columns, greedy)

    engine.generate = tight
    try:
        rows = [t.train_step()[0] for _ in range(3)]
        t.source.settle()
        # the first collection ran out of memory once and found 2 prompts per call; every later collection,
        # on the worker thread, used that cap from the start: no second out-of-memory error
        assert raised == [4]
        assert t.state.rollout_prompts == 2 and t.state.oom_retries == 1
        assert [m["oom_retries_total"] for m in rows] == [1, 1, 1]
    finally:
        t.run.unlock()


def test_clip_higher_reaches_the_update_before_and_after_a_resume(tiny_model_dir, run_root, monkeypatch):
    """The entropy-collapse action (monitor.auto_clip_higher): the raised epsilon_high is what the next updates
    clip with, and it comes back with the checkpoint."""
    clips: list[float] = []
    real_update = trainer_module.policy_update

    def update(model, optimizer, batch, algo, **kw):
        clips.append(algo.epsilon_high)
        return real_update(model, optimizer, batch, algo, **kw)

    monkeypatch.setattr(trainer_module, "policy_update", update)
    t = build_trainer(overrides=small(tiny_model_dir, run_root, "clip", **{"monitor.auto_clip_higher": True,
                                                                           "monitor.auto_epsilon_high": 0.28}))
    base = t.base_cfg.algo.epsilon_high
    try:
        t.train_step()
        alarm = Alarm("entropy_collapse", t.state.step, "forced by the test", "", action_key="raise_epsilon_high")
        assert "-> 0.28" in t.take(planned_action(t.monitor, alarm, t.cfg))
        t.train_step()
        t.save_checkpoint()
    finally:
        t.run.unlock()
    resumed = build_trainer(resume=t.run.path)
    try:
        resumed.train_step()
    finally:
        resumed.run.unlock()
    assert base < 0.28 and clips == [base, 0.28, 0.28]
