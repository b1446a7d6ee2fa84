"""Streaming episodes (agent.streaming, tinyrl.rollout.episodes): trajectories advance independently
through one decode session. Under greedy decoding they produce exactly the turn-synchronous rollout;
a trajectory waiting on its tool does not hold the others' decoding back."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace

import torch

from tests.rollout.test_agent_loop import PROMPTS, Result, ToyFormat, echo_env
from tinyrl.rollout.agent import AgentEngine
from tinyrl.rollout.base import SamplingParams
from tinyrl.rollout.hf import HFEngine

PARAMS = SamplingParams(max_new_tokens=40)
GREEDY_PROMPTS = ["N", "gtJs", "afU]z", "cN", "S", "ab", "q", "g"]  # with `perturbed`, most call the tool greedily


@contextlib.contextmanager
def perturbed(model):
    """A non-zero adapter (so the merged-LoRA decode path is the one compared), zeroed again after."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.zero_()


def agent(policy, streaming: bool, env=echo_env, max_turns=3, workers=8):
    model, tok = policy
    cfg = SimpleNamespace(max_turns=max_turns, max_obs_tokens=12, mask_observations=True, streaming=streaming)
    return AgentEngine(HFEngine(model, tok, seed=0), tok, ToyFormat(), env, cfg, workers=workers)


def rows(b):
    """Each row's ids, observation mask and sampled-token logprobs, unpadded."""
    out = []
    for i in range(b.num_rows):
        n = int(b.completion_mask[i].sum())
        out.append((b.completion_ids[i, :n].tolist(), b.observation_mask[i, :n].tolist(), b.sampling_logprobs[i, :n]))
    return out


def test_streaming_gives_the_turn_synchronous_ids_under_greedy_decoding(char_policy):
    with perturbed(char_policy[0]):
        sync = agent(char_policy, streaming=False).generate(GREEDY_PROMPTS, n=1, params=PARAMS, greedy=True)
        stream = agent(char_policy, streaming=True).generate(GREEDY_PROMPTS, n=1, params=PARAMS, greedy=True)
    assert sum(t["tool_calls"] > 1 for t in sync.trajectories) >= 2, "too few multi-turn episodes to compare"
    for (ids_a, obs_a, lp_a), (ids_b, obs_b, lp_b) in zip(rows(sync), rows(stream)):
        assert ids_a == ids_b and obs_a == obs_b
        assert torch.allclose(lp_a, lp_b, atol=1e-4)
    assert [t["turns"] for t in sync.trajectories] == [t["turns"] for t in stream.trajectories]
    assert sync.truncated.tolist() == stream.truncated.tolist()
    assert torch.equal(sync.loss_mask, stream.loss_mask)


def test_streaming_sampled_rollouts_keep_the_agent_invariants(char_policy):
    b = agent(char_policy, streaming=True).generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=40, stream=0))
    assert b.num_rows == 8 and b.group.tolist() == [0] * 4 + [1] * 4
    assert any(t["tool_calls"] for t in b.trajectories)
    assert int(b.completion_mask.sum(-1).max()) <= 40
    assert (b.loss_mask * b.observation_mask).sum() == 0
    assert (b.sampling_logprobs[b.observation_mask.bool()] == 0).all()
    for i, t in enumerate(b.trajectories):
        assert t["tool_calls"] <= 3
        n_obs_runs = sum(1 for a, c in zip([0] + b.observation_mask[i].tolist(), b.observation_mask[i].tolist())
                         if c and not a)
        assert n_obs_runs == min(t["tool_calls"], n_obs_runs)  # one observation per call (the budget may cut one)


class SlowEnv:
    """The first trajectory's tool sleeps; every call records when it ran."""

    calls: list = []
    lock = threading.Lock()

    def __init__(self, row):
        self.row = row

    def step(self, calls):
        start = time.perf_counter()
        if self.row.get("slow"):
            time.sleep(0.3)
        with self.lock:
            SlowEnv.calls.append((self.row.get("slow", False), start, time.perf_counter()))
        return [Result("r" + c.arguments["q"]) for c in calls]


class TimedSession:
    """The engine's own session, its decode steps time-stamped."""

    def __init__(self, cm, stamps):
        self.cm, self.stamps = cm, stamps

    def __enter__(self):
        self.s = self.cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)

    def __len__(self):
        return len(self.s)

    def add(self, *a, **kw):
        self.s.add(*a, **kw)

    def step(self):
        out = self.s.step()
        self.stamps.append(time.perf_counter())
        return out

    def pause(self):
        return self.s.pause()


def test_a_slow_tool_does_not_stall_the_other_trajectories(char_policy):
    model, tok = char_policy
    SlowEnv.calls = []
    stamps: list[float] = []
    eng = agent(char_policy, streaming=True, env=SlowEnv)
    hf = eng.inner
    eng.inner = SimpleNamespace(session=lambda params, greedy=False: TimedSession(hf.session(params, greedy), stamps),
                                sample=hf.sample)
    cols = [{"slow": True}] + [{} for _ in range(3)]
    with perturbed(model):
        eng.generate(["N", "gtJs", "cN", "g"], n=1, params=PARAMS, columns=cols, greedy=True)
    slow = [(s, e) for is_slow, s, e in SlowEnv.calls if is_slow]
    assert slow, "the slow trajectory made no tool call"
    start, end = slow[0]
    during = [t for t in stamps if start < t < end]
    assert during, "no decode step ran while the slow tool was running: the batch waited for it"
