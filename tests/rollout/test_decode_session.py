"""Decode sessions on the transformers engine: rows that join a running batch, leave it, and pause."""

import pytest
import torch

from tests.rollout.test_hf_engine import NoEosTokenizer
from tinyrl.config import LoraConfig, ModelConfig
from tinyrl.model import load_policy
from tinyrl.rollout.base import SamplingParams
from tinyrl.rollout.engine import SamplingEngine
from tinyrl.rollout.hf import HFEngine
from tinyrl.rollout.session import CallSession

PROMPTS = ["1+2=", "34+56=", "7+8=", "9", "123+4="]  # different lengths (one of a single token)


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(ModelConfig(name=tiny_model_dir), LoraConfig(r=4, alpha=8))


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    """A policy whose adapter on every linear is non-zero: the decode runs merged W + dW linears."""
    model, tok = load_policy(ModelConfig(name=tiny_model_dir), LoraConfig(r=4, alpha=8, target_modules="all-linear"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model, tok


def contexts(tok):
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def run(s, plan: dict[int, list[tuple]], live_at: dict | None = None) -> dict:
    """Step `s` until it is empty and nothing is left to add; plan[step] = `add` arguments queued before
    that step (`live_at[step]`: the rows live then). Returns {(key, j): Sample}."""
    out, step = {}, 0
    while len(s) or any(k >= step for k in plan):
        if step in plan and live_at is not None:
            live_at[step] = len(s)
        for args in plan.get(step, []):
            s.add(*args)
        for key, j, smp in s.step():
            assert (key, j) not in out
            out[key, j] = smp
        step += 1
    return out


def forward_logprobs(model, context: list[int], ids: list[int]) -> torch.Tensor:
    """log p of each of `ids` after `context` under one full forward pass (temperature 1)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + ids])).logits[0, len(context) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("mode", ["greedy", "streams", "per-call"])
def test_a_session_joined_before_its_first_step_draws_what_sample_draws(policy, mode):
    """All contexts added before the first step: sample's ids and logprobs, under greedy decoding, under
    sampling with a stream per context and with the session's own generator; n > 1, per-context
    budgets and a stop string; the engine's seed position advances once, as sample's does."""
    model, tok = policy
    ctx = contexts(tok)
    budgets = [9, 4, 12, 7, 1]
    stream = None if mode != "streams" else 11
    p = SamplingParams(max_new_tokens=12, stop=["+"], stream=stream)
    greedy = mode == "greedy"
    want_eng = HFEngine(model, tok, seed=7)
    want = want_eng.sample(ctx, p, n=3, greedy=greedy, max_new=budgets)
    eng = HFEngine(model, tok, seed=7)
    with eng.session(p, greedy) as s:
        got = run(s, {0: [(f"c{i}", c, m, 3, None if stream is None else stream + i)
                          for i, (c, m) in enumerate(zip(ctx, budgets))]})
    assert eng.calls == want_eng.calls == 1
    assert len(got) == 3 * len(ctx)
    finishes = set()
    for i, group in enumerate(want):
        for j, w in enumerate(group):
            g = got[f"c{i}", j]
            assert g.token_ids == w.token_ids and g.finish == w.finish
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-6, rtol=0)
            assert len(g.token_ids) <= budgets[i]
            finishes.add(g.finish)
    assert "length" in finishes and len(finishes) > 1  # budgets and eos / stop both ended rows


@pytest.mark.parametrize("which", ["base", "lora", "model-forward"])
def test_rows_joining_a_running_batch_decode_as_if_alone(policy, trained, which, monkeypatch):
    """Contexts joining at steps 0, 3 and 7 (while others are mid-decode, after one left) and after the
    batch emptied: each gives the greedy ids it gives sampled alone, and the logprobs of a plain
    forward pass over its context and ids; with a non-zero LoRA adapter on every linear too, and
    decoding through the model's own forward (not `DecodeStep`)."""
    import tinyrl.rollout.hf as hf

    if which == "model-forward":
        monkeypatch.setattr(hf.DecodeStep, "of", classmethod(lambda cls, trunk: None))
    model, tok = trained if which == "lora" else policy
    no_eos = NoEosTokenizer(tok)  # rows end on their budgets: the joins land mid-decode
    ctx = contexts(tok)
    p = SamplingParams(max_new_tokens=16)
    plan = {0: [("a", ctx[0], 3), ("b", ctx[1], 12, 2)], 3: [("c", ctx[2], 8)], 7: [("d", ctx[3], 6)],
            16: [("e", ctx[4], 4)]}  # b and d end at step 11 and 12; e joins an empty session
    with HFEngine(model, no_eos, seed=1).session(p, greedy=True) as s:
        got = run(s, plan)
    assert set(got) == {("a", 0), ("b", 0), ("b", 1), ("c", 0), ("d", 0), ("e", 0)}
    for args in (a for adds in plan.values() for a in adds):
        key, context, budget = args[:3]
        alone = HFEngine(model, no_eos, seed=1).sample([context], p, greedy=True, max_new=[budget])[0][0]
        for j in range(args[3] if len(args) > 3 else 1):
            g = got[key, j]
            assert g.token_ids == alone.token_ids and len(g.token_ids) == budget and g.finish == "length"
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=0)
            assert torch.allclose(torch.tensor(g.logprobs), forward_logprobs(model, context, g.token_ids), atol=1e-4)


def test_a_context_with_its_own_stream_draws_the_same_samples_whenever_it_joins(policy):
    """A context's samples come from its stream's generator: joining at step 5 of a batch drawing
    from other streams, it draws the ids `sample` draws for that stream alone."""
    model, tok = policy
    no_eos = NoEosTokenizer(tok)
    ctx = contexts(tok)
    p = SamplingParams(max_new_tokens=10, temperature=0.9)
    with HFEngine(model, no_eos, seed=2).session(p) as s:
        got = run(s, {0: [("x", ctx[0], 10, 2, 40), ("y", ctx[4], 10, 1, None)], 5: [("z", ctx[1], 10, 3, 41)]})
    for key, context, stream, n in (("x", ctx[0], 40, 2), ("z", ctx[1], 41, 3)):
        alone = HFEngine(model, no_eos, seed=2).sample([context], SamplingParams(max_new_tokens=10, temperature=0.9,
                                                                                 stream=stream), n=n)[0]
        assert [got[key, j].token_ids for j in range(n)] == [a.token_ids for a in alone]
        assert len({tuple(a.token_ids) for a in alone}) > 1  # sampled, not greedy


def test_joining_works_on_transformers_plain_cache(policy, monkeypatch):
    """The growing cache and transformers' DynamicCache join rows alike (the fallback cache)."""
    from transformers import DynamicCache

    import tinyrl.rollout.hf as hf

    model, tok = policy
    no_eos = NoEosTokenizer(tok)
    ctx = contexts(tok)
    plan = {0: [("a", ctx[1], 6)], 2: [("b", ctx[3], 6), ("c", ctx[0], 3, 2)]}
    p = SamplingParams(max_new_tokens=6)
    with HFEngine(model, no_eos).session(p, greedy=True) as s:
        grown = run(s, plan)
    monkeypatch.setattr(hf, "decode_cache", DynamicCache)
    with HFEngine(model, no_eos).session(p, greedy=True) as s:
        plain = run(s, plan)
    assert grown.keys() == plain.keys()
    for k in grown:
        assert grown[k].token_ids == plain[k].token_ids
        assert torch.allclose(torch.tensor(grown[k].logprobs), torch.tensor(plain[k].logprobs), atol=1e-5)


def test_pause_ends_every_row_and_a_continuation_completes_it(policy):
    """pause() returns each live row's tokens so far and each queued row empty, all "paused", and
    leaves the session empty; continuing a paused row from its context + tokens (greedy) gives the
    completion it would have had unpaused."""
    model, tok = policy
    no_eos = NoEosTokenizer(tok)
    ctx = contexts(tok)
    p = SamplingParams(max_new_tokens=10)
    eng = HFEngine(model, no_eos)
    full = eng.sample([ctx[1]], p, greedy=True)[0][0]
    with eng.session(p, greedy=True) as s:
        s.add("a", ctx[1], 10)
        for _ in range(4):
            assert s.step() == []
        s.add("q", ctx[0], 10, 2)
        assert len(s) == 3
        paused = {(k, j): smp for k, j, smp in s.pause()}
        assert len(s) == 0 and s.step() == []
    assert set(paused) == {("a", 0), ("q", 0), ("q", 1)}
    assert all(smp.finish == "paused" for smp in paused.values())
    assert paused["q", 0].token_ids == [] and paused["q", 1].token_ids == []
    part = paused["a", 0]
    assert part.token_ids == full.token_ids[:4] and len(part.logprobs) == 4
    rest = eng.sample([ctx[1] + part.token_ids], p, greedy=True, max_new=[6])[0][0]
    assert part.token_ids + rest.token_ids == full.token_ids
    assert torch.allclose(torch.tensor(part.logprobs + rest.logprobs), torch.tensor(full.logprobs), atol=1e-4)


def test_session_restores_training_mode(policy):
    model, tok = policy
    model.train()
    with HFEngine(model, tok).session(SamplingParams()) as s:
        assert not model.training and len(s) == 0
    assert model.training


@pytest.mark.parametrize("stream", [None, 3])
def test_the_call_session_fallback_draws_what_sample_draws(policy, stream):
    """CallSession: an engine's `sample` per step; the whole queue of one call's shape is one call."""
    model, tok = policy
    ctx = contexts(tok)
    p = SamplingParams(max_new_tokens=8, stream=stream)
    want = HFEngine(model, tok, seed=4).sample(ctx, p, n=2)
    eng = HFEngine(model, tok, seed=4)
    s = CallSession(eng, p)
    for i, c in enumerate(ctx):
        s.add(i, c, 8, 2, None if stream is None else stream + i)
    assert len(s) == 2 * len(ctx)
    got = {(k, j): smp for k, j, smp in s.step()}
    assert len(s) == 0 and eng.calls == 1
    assert [[got[i, j].token_ids for j in range(2)] for i in range(len(ctx))] == \
        [[w.token_ids for w in group] for group in want]
    s.add("late", ctx[0], 8)
    assert [(k, smp.finish) for k, _, smp in s.pause()] == [("late", "paused")] and len(s) == 0


def test_an_engine_with_only_sample_gets_a_call_session(policy):
    model, tok = policy

    class OnlySample(SamplingEngine):
        def __init__(self, inner):
            self.sample, self.tokenizer = inner.sample, inner.tokenizer

    with HFEngine(model, tok).session(SamplingParams()) as own, \
            OnlySample(HFEngine(model, tok)).session(SamplingParams()) as fallback:
        assert not isinstance(own, CallSession) and isinstance(fallback, CallSession)
