"""The transformers engine: shapes, groups, one encode per prompt, logprobs, stops, seeding."""

import pytest
import torch

from tinyrl.config import LoraConfig, ModelConfig
from tinyrl.model import load_policy
from tinyrl.rollout.base import Rollouts, SamplingParams
from tinyrl.rollout.hf import HFEngine, _StopOnStrings, completion_mask_of
from tinyrl.update import score_logprobs

PROMPTS = ["1+2=", "34+56=", "7+8="]  # different lengths: left padding matters


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(ModelConfig(name=tiny_model_dir), LoraConfig(r=4, alpha=8))


class CountingTokenizer:
    """Wraps a tokenizer and records the batch size of every encode call."""

    def __init__(self, tok):
        self._tok, self.calls = tok, []

    def __call__(self, texts, **kw):
        self.calls.append(len(texts))
        return self._tok(texts, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_generate_shapes_groups_and_single_encode(policy):
    model, tok = policy
    counting = CountingTokenizer(tok)
    eng = HFEngine(model, counting, seed=1)
    r = eng.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=6), columns=[{"i": i} for i in range(3)])
    assert counting.calls == [3]  # each prompt encoded once, not n times
    assert r.completion_ids.shape[0] == 12 and r.completion_ids.shape[1] <= 6
    assert r.group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert r.prompts[4] == "34+56=" and r.columns[11] == {"i": 2}
    for g in range(3):  # every row of a group carries the same prompt ids
        rows = r.prompt_ids[r.group == g]
        assert (rows == rows[0]).all()
    assert r.sampling_logprobs.shape == r.completion_ids.shape
    assert (r.sampling_logprobs[r.completion_mask == 0] == 0).all()
    assert (r.sampling_logprobs[r.completion_mask == 1] <= 0).all()
    assert r.truncated.dtype == torch.bool


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_match_trainer_logprobs(policy, temperature):
    model, tok = policy
    eng = HFEngine(model, tok, seed=2)
    r = eng.generate(PROMPTS, n=3, params=SamplingParams(temperature=temperature, max_new_tokens=8))
    trainer = score_logprobs(model, r, temperature, micro_batch=4, chunk_size=16, impl="torch")
    m = r.completion_mask.bool()
    assert torch.allclose(r.sampling_logprobs[m], trainer[m], atol=1e-4)


def test_seeded_sampling_is_reproducible(policy):
    model, tok = policy
    p = SamplingParams(max_new_tokens=6)
    a = HFEngine(model, tok, seed=3).generate(PROMPTS, n=4, params=p)
    b = HFEngine(model, tok, seed=3).generate(PROMPTS, n=4, params=p)
    assert torch.equal(a.completion_ids, b.completion_ids)
    eng = HFEngine(model, tok, seed=3)
    eng.generate(PROMPTS, n=4, params=p)
    c = eng.generate(PROMPTS, n=4, params=p)  # next call: the next seed position
    assert not torch.equal(a.completion_ids, c.completion_ids)
    rng = torch.random.get_rng_state()
    eng.generate(PROMPTS, n=2, params=p)
    assert torch.equal(rng, torch.random.get_rng_state())  # the global RNG is left untouched


def test_completion_mask_eos_pad_and_truncation():
    eos, pad = 1, 0
    ids = torch.tensor([[5, 6, 1, 0], [5, 6, 7, 8], [5, 1, 0, 0], [5, 6, 0, 0]])
    texts = ["ab", "abcd", "a", "a\n"]
    mask, trunc = completion_mask_of(ids, texts, eos, pad, stop=["\n"])
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert trunc.tolist() == [False, True, False, False]  # row 3 ended on a stop string


def test_stop_on_strings(policy):
    _, tok = policy
    ids = tok(["1+1=2\n", "1+1=22"], return_tensors="pt", padding=True).input_ids
    crit = _StopOnStrings(tok, ["\n"], prompt_len=4)
    assert crit(ids, None).tolist() == [True, False]


def test_select_and_concat_roundtrip(policy):
    model, tok = policy
    eng = HFEngine(model, tok, seed=4)
    r = eng.generate(PROMPTS, n=2, params=SamplingParams(max_new_tokens=5))
    r.rewards = torch.arange(6.0)
    part = r.select([2, 3, 4, 5])
    assert part.group.tolist() == [0, 0, 1, 1] and part.rewards.tolist() == [2, 3, 4, 5]
    both = Rollouts.concat([r.select([0, 1]), part])
    assert both.group.tolist() == [0, 0, 1, 1, 2, 2]
    assert both.rewards.tolist() == [0, 1, 2, 3, 4, 5]
    assert both.completions == [r.completions[i] for i in range(6)]
