"""One-step-off rollouts (rollout.overlap, tinyrl.sources.overlap): the rollout copy shares the base, the adapter is
handed over before each collection, every trained token is one version old, a killed run resumes."""

from __future__ import annotations

import pytest
import torch

from tests.test_resume import kill_9_after_first_checkpoint, overrides
from tinyrl.api import build_trainer
from tinyrl.config import load_config
from tinyrl.errors import ConfigError
from tinyrl.sources import OverlapSource, PartialSource, SyncSource, shared_base_copy


def lora(model):
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def test_the_rollout_copy_shares_the_base_and_owns_its_adapter(tiny_model_dir, run_root):
    t = build_trainer(overrides=overrides(tiny_model_dir, run_root, "copy"))
    try:
        copy = shared_base_copy(t.model)
        frozen = {n: p for n, p in t.model.named_parameters() if not p.requires_grad}
        for n, p in copy.named_parameters():
            if n in frozen:
                assert p.data_ptr() == frozen[n].data_ptr()  # the base is held once
            else:
                assert p.data_ptr() != dict(t.model.named_parameters())[n].data_ptr()
        assert sum(1 for p in copy.parameters() if p.requires_grad) == len(lora(t.model)) > 0
    finally:
        t.run.unlock()


def test_the_adapter_is_handed_over_before_each_collection(tiny_model_dir, run_root):
    o = {**overrides(tiny_model_dir, run_root, "overlap"), "rollout.max_staleness": 1, "rollout.overlap": True,
         "train.save_every": 0}
    t = build_trainer(overrides=o)
    try:
        assert isinstance(t.source, OverlapSource)
        p0 = lora(t.model)
        m1, _ = t.train_step()  # trains on a batch of version 0; launches step 2's collection with version 0
        t.source.settle()
        assert all(torch.equal(a, b) for a, b in zip(lora(t.source.rollout_model), p0))
        p1 = lora(t.model)
        assert any(not torch.equal(a, b) for a, b in zip(p0, p1)), "the update did not move the adapter"
        m2, _ = t.train_step()  # trains on version 0's batch at version 1; hands version 1 over
        t.source.settle()
        assert all(torch.equal(a, b) for a, b in zip(lora(t.source.rollout_model), p1))
        assert m1["staleness_max"] == 0 and m2["staleness_mean"] == 1 and m2["staleness/1"] == 1.0
        assert m2["overlap_s"] >= 0 and m2["rollout_wait_s"] >= 0
        # the behaviour policy of step 2's batch is the adapter before the step-1 update, not the current one
        assert m2["rollout_trainer_k3"] > 1e-6 > abs(m1["rollout_trainer_k3"])
    finally:
        t.run.unlock()


def test_overlap_beside_a_pool_of_partial_rollouts_spends_one_version(tiny_model_dir, run_root):
    base = {**overrides(tiny_model_dir, run_root, "k1"), "rollout.overlap": True, "train.save_every": 0,
            "rollout.max_staleness": 1, "rollout.max_new_tokens": 8}
    t = build_trainer(overrides=base)
    try:  # k = 1: every trained token is exactly one version old: nothing is left to carry a group with
        assert isinstance(t.source.inner, SyncSource)
    finally:
        t.run.unlock()
    t = build_trainer(overrides={**base, "rollout.max_staleness": 2, "log.name": "k2"})
    try:
        assert isinstance(t.source.inner, PartialSource)
        rows = [t.train_step()[0] for _ in range(4)]
        for m in rows[1:]:
            assert m["staleness/0"] == 0.0 and 1 <= m["staleness_mean"] and m["staleness_max"] <= 2
    finally:
        t.run.unlock()


def test_overlap_needs_staleness_and_the_hf_engine():
    with pytest.raises(ConfigError, match="rollout.overlap: trains on tokens one policy version old"):
        load_config("tiny_grpo_cpu", {"rollout.overlap": True})
    for engine in ("vllm", "stale"):  # refused when the config resolves, before any model loads
        with pytest.raises(ConfigError, match=f"rollout.overlap: one-step-off runs with the hf and vllm_server engines "
                                              f".*not {engine}"):
            load_config("tiny_grpo_cpu", {"rollout.overlap": True, "rollout.max_staleness": 1,
                                          "rollout.engine": engine})
    load_config("tiny_grpo_cpu", {"rollout.overlap": True, "rollout.max_staleness": 1, "rollout.engine": "vllm_server",
                                  "rollout.server_url": "http://127.0.0.1:8000"})  # a server on devices of its own


@pytest.mark.slow
def test_kill_9_during_an_overlapped_run_resumes(tiny_model_dir, run_root):
    o = {**overrides(tiny_model_dir, run_root, "killed"), "rollout.max_staleness": 1, "rollout.overlap": True}
    run, saved = kill_9_after_first_checkpoint(o)
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(1, o["train.steps"] + 1))
    assert metrics[saved]["staleness_max"] == 0  # the batch in flight at the checkpoint was collected again


@pytest.mark.slow
def test_one_step_off_on_the_search_agent_trains_on_tokens_one_version_old(run_root):
    import tinyrl

    run = tinyrl.train("tiny_search_cpu", **{"train.steps": 4, "rollout.max_staleness": 1, "rollout.overlap": True,
                                             "log.run_dir": run_root, "log.progress": False,
                                             "train.eval_before_after": False})
    assert [m["staleness_max"] for m in run.metrics] == [0, 1, 1, 1]
    assert all(m["staleness/1"] == 1.0 for m in run.metrics[1:])
    assert not run.alarms  # the stale-weights canary knows these tokens are one version old on purpose
