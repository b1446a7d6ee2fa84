"""The multi-turn loop (tinyrl.rollout.agent) on a random char-level model with a toy call format:
exact sampled ids, masked observations, turn and budget limits, trainer parity, zero gradient on
observation tokens. (The real formats and tools are tinyrl.agents; these doubles are ours too.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import Recording
from tinyrl.rollout.agent import AgentEngine
from tinyrl.rollout.base import SamplingParams
from tinyrl.rollout.hf import HFEngine


@dataclass
class Call:
    name: str
    arguments: dict = field(default_factory=dict)


@dataclass
class Result:
    text: str
    error: str | None = None


class ToyFormat:
    """A turn that ends with "]" is a tool call; "!" ends the episode."""

    stop, final = ["]"], ["!"]

    def parse(self, text):
        return [Call("echo", {"q": text.split("]")[0][-3:]})]

    def observation(self, results, tokenizer=None):
        return "<" + "|".join(r.text for r in results) + ">"


class EchoEnv:
    def __init__(self):
        self.steps = 0

    def reset(self, row):
        self.row = row

    def step(self, calls):
        self.steps += 1
        return [Result(f"obs{self.steps}:" + c.arguments["q"] * 3) for c in calls]


def echo_env(row):  # the factory contract: an environment already reset with its row
    env = EchoEnv()
    env.reset(row)
    return env


def agent(policy, max_turns=3, max_obs=12, mask=True, seed=0):
    model, tok = policy
    cfg = SimpleNamespace(max_turns=max_turns, max_obs_tokens=max_obs, mask_observations=mask)
    inner = Recording(HFEngine(model, tok, seed=seed))
    return AgentEngine(inner, tok, ToyFormat(), echo_env, cfg), inner


PROMPTS = ["ab", "xyz"]
PARAMS = SamplingParams(max_new_tokens=40)


def test_completion_is_sampled_ids_and_observation_ids_exactly(char_policy):
    _, tok = char_policy
    eng, inner = agent(char_policy)
    b = eng.generate(PROMPTS, n=4, params=PARAMS)
    assert b.num_rows == 8 and b.group.tolist() == [0] * 4 + [1] * 4
    assert any(t["tool_calls"] for t in b.trajectories), "the toy model made no tool call: the test sees nothing"
    sampled = {tuple(s.token_ids) for s in inner.samples}
    for i, info in enumerate(b.trajectories):
        n = int(b.completion_mask[i].sum())
        ids, obs = b.completion_ids[i, :n].tolist(), b.observation_mask[i, :n].tolist()
        # split the row into its segments: each model segment is one sample, verbatim
        segs, cur, kind = [], [], obs[0] if n else 0
        for t, o in zip(ids, obs):
            if o != kind:
                segs.append((kind, cur))
                cur, kind = [], o
            cur.append(t)
        if cur:
            segs.append((kind, cur))
        model_segs = [s for k, s in segs if k == 0]
        assert all(tuple(s) in sampled for s in model_segs)
        assert len(model_segs) == info["turns"]
        for j, (k, s) in enumerate(segs):
            if k == 1:  # an observation: the tokenised observation text, unchanged
                text = tok.decode(s)
                if j == len(segs) - 1 and n >= PARAMS.max_new_tokens:  # the budget cuts the last one short
                    assert text.startswith("<obs") or "<obs".startswith(text)
                else:
                    assert text.startswith("<obs") and text.endswith(">")
        assert (b.loss_mask[i] * b.observation_mask[i]).sum() == 0  # never in the loss
        assert (b.sampling_logprobs[i][b.observation_mask[i].bool()] == 0).all()
        assert info["tool_calls"] <= 3


def test_turn_and_budget_limits(char_policy):
    eng, _ = agent(char_policy, max_turns=1, max_obs=5)
    b = eng.generate(PROMPTS, n=6, params=SamplingParams(max_new_tokens=25))
    assert int(b.completion_mask.sum(-1).max()) <= 25
    for i, t in enumerate(b.trajectories):
        assert t["tool_calls"] <= 1 and t["turns"] <= 2
        obs_runs = b.observation_mask[i].tolist()
        assert sum(obs_runs) <= 5  # one observation, cut to max_obs_tokens
        if t["hit_max_turns"]:
            assert t["tool_calls"] == 1 and not b.truncated[i]
    assert b.truncated.any() or any(t["hit_max_turns"] for t in b.trajectories)


def test_observation_is_cut_inside_the_wrapper(char_policy):
    _, tok = char_policy
    eng, _ = agent(char_policy, max_obs=8)
    ids = eng._observation_ids([Result("a long observation text " * 5)])
    text = tok.decode(ids)
    assert len(ids) <= 8 and text.startswith("<") and text.endswith(">")


def test_multi_turn_logprobs_match_the_trainer(char_policy):
    from tinyrl.update import score

    model, _ = char_policy
    eng, _ = agent(char_policy)
    b = eng.generate(PROMPTS, n=4, params=PARAMS)
    s = score(model, b, 1.0, micro_batch=3, chunk_size=16, impl="torch")
    m = b.action_mask.bool()
    assert torch.allclose(s.logprobs[m], b.sampling_logprobs[m], atol=1e-4)
    assert (s.logprobs[b.observation_mask.bool()] == 0).all()


def test_observation_tokens_have_no_gradient_and_do_not_change_the_loss(char_policy):
    from tinyrl.algo.losses import BatchTotals, policy_loss
    from tinyrl.config import AlgoConfig
    from tinyrl.update import policy_update

    model, _ = char_policy
    eng, _ = agent(char_policy)
    b = eng.generate(PROMPTS, n=4, params=PARAMS)
    obs = b.observation_mask.bool()
    assert obs.any()
    g = torch.Generator().manual_seed(0)
    b.advantages = torch.randn(b.completion_ids.shape, generator=g)  # token-level, so obs positions have one
    b.old_logprobs = b.sampling_logprobs + 0.1 * torch.randn(b.completion_ids.shape, generator=g)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.0)

    def update(batch):
        for p in params:
            p.grad = None
        res = policy_update(model, opt, batch, AlgoConfig(tis="token"), temperature=1.0, micro_batch=4,
                            max_grad_norm=1e9, max_len=40)
        return res.stats["loss"], [p.grad.clone() for p in params]

    loss0, g0 = update(b)
    changed = b.select(list(range(b.num_rows)))  # everything an observation token carries, changed
    changed.sampling_logprobs = b.sampling_logprobs.masked_fill(obs, -3.0)
    changed.old_logprobs = b.old_logprobs.masked_fill(obs, 5.0)
    changed.advantages = b.advantages.masked_fill(obs, 100.0)
    loss1, g1 = update(changed)
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    assert all(torch.allclose(x, y, atol=1e-7) for x, y in zip(g0, g1))
    # and the logprob of an observation token gets zero gradient from the loss (full logits, plain)
    ids = torch.cat([b.prompt_ids, b.completion_ids], 1)
    attn = torch.cat([b.prompt_mask, b.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P, T = b.prompt_ids.shape[1], b.completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1: P + T - 1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, b.completion_ids[..., None]).squeeze(-1)
    logp.retain_grad()
    mask = b.loss_mask.float()
    policy_loss(logp, b.old_logprobs, b.advantages, mask, AlgoConfig(), totals=BatchTotals.of(mask, 40)).loss.backward()
    assert (logp.grad[obs] == 0).all() and (logp.grad[b.loss_mask.bool()] != 0).any()


def test_unmasked_ablation_trains_on_observations(char_policy):
    eng, _ = agent(char_policy, mask=False)
    b = eng.generate(PROMPTS, n=4, params=PARAMS)
    assert b.observation_mask.any()
    assert torch.equal(b.loss_mask, b.completion_mask)
