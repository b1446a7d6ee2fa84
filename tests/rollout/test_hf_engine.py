"""The transformers engine: shapes, groups, one encode per prompt, logprobs, stops, budgets, seeding."""

import contextlib

import pytest
import torch

from tinyrl.config import LoraConfig, ModelConfig
from tinyrl.model import load_policy
from tinyrl.rollout.base import Rollouts, SamplingParams, StopStrings
from tinyrl.rollout.hf import HFEngine
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


def test_stop_strings_end_rows_and_keep_the_exact_ids(policy):
    model, tok = policy
    eng = HFEngine(model, tok, seed=5)
    free = eng.sample([tok("1+2=")["input_ids"]], SamplingParams(max_new_tokens=12), n=16)[0]
    # a character the free samples produce somewhere after their first token becomes the stop string
    chars = [c for s in free for c in tok.decode(s.token_ids[1:], skip_special_tokens=True)]
    stop = max(set(chars), key=chars.count)
    eng = HFEngine(model, tok, seed=5)
    got = eng.sample([tok("1+2=")["input_ids"]], SamplingParams(max_new_tokens=12, stop=[stop]), n=16)[0]
    stopped = [s for s in got if s.finish == "stop"]
    assert stopped
    for s in stopped:
        text = tok.decode(s.token_ids, skip_special_tokens=True)
        assert text.endswith(stop) and stop not in tok.decode(s.token_ids[:-1], skip_special_tokens=True)
    for s in got:
        assert len(s.token_ids) == len(s.logprobs) <= 12
        assert (s.finish == "eos") == (s.token_ids[-1] == tok.eos_token_id)
        assert s.finish != "length" or len(s.token_ids) == 12


def test_per_row_budgets_and_greedy(policy):
    model, tok = policy
    eng = HFEngine(model, tok, seed=6)
    ctx = [tok(p)["input_ids"] for p in PROMPTS]
    rows = eng.sample(ctx, SamplingParams(max_new_tokens=10), n=2, max_new=[1, 3, 10])
    for (a, b), cap in zip(rows, (1, 3, 10)):
        assert len(a.token_ids) <= cap and len(b.token_ids) <= cap
    assert all(s.finish in ("length", "eos") for s in rows[0])
    g1 = eng.sample(ctx, SamplingParams(max_new_tokens=6), n=1, greedy=True)
    g2 = HFEngine(model, tok, seed=99).sample(ctx, SamplingParams(max_new_tokens=6), n=1, greedy=True)
    assert [r[0].token_ids for r in g1] == [r[0].token_ids for r in g2]  # greedy ignores the seed


def test_stop_string_check_reads_only_the_newest_tokens(policy):
    _, tok = policy
    s = StopStrings(tok, ["\n"])
    assert s.hit([tok("1+1=2\n")["input_ids"], tok("1+1=22")["input_ids"]]) == [True, False]
    assert not StopStrings(tok, [])


def _draw(logp, top_p, gen):
    """The engine's draw with every row owned by one generator (a `sample` call without a stream)."""
    from tinyrl.rollout.hf import _draw_per_context

    return _draw_per_context(logp, top_p, [gen], torch.zeros(logp.shape[0], dtype=torch.long))


def test_top_p_keeps_the_nucleus_only():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws = {int(_draw(logp, 0.7, g)) for _ in range(300)}
    assert draws == {0, 1}  # 0.5 + 0.3 reaches 0.7; 0.15 and 0.05 are never drawn


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_draws_follow_the_distribution_and_never_pick_a_token_without_mass(top_p):
    """The inverse-CDF draw: token frequencies over 40,000 rows match the (nucleus-renormalised)
    probabilities to 4.5 standard errors, and tokens of probability 0 never come."""
    p = torch.tensor([0.0, 0.42, 0.0, 0.3, 0.2, 0.0, 0.08])
    logp = torch.log(p).expand(40_000, -1)
    counts = torch.bincount(_draw(logp, top_p, torch.Generator().manual_seed(3)), minlength=p.numel()).float()
    want = p.clone()
    if top_p < 1:
        want[6] = 0.0  # 0.42 + 0.3 + 0.2 reaches 0.9 before the 0.08 token
    want /= want.sum()
    se = (want * (1 - want) / counts.sum()).sqrt()
    assert (counts[want == 0] == 0).all()
    assert ((counts / counts.sum() - want).abs() <= 4.5 * se + 1e-9).all(), (counts / counts.sum(), want)


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


def test_growing_decode_cache_draws_what_the_plain_cache_draws(policy, monkeypatch):
    """The decode loop's cache appends into spare capacity (reallocated past 64 + 2x); rows that end
    leave it. Same ids and logprobs as transformers' DynamicCache, which concatenates per token."""
    from transformers import DynamicCache

    import tinyrl.rollout.hf as hf

    model, tok = policy
    no_eos = NoEosTokenizer(tok)  # rows end on their budgets only: 90, 20 and 75 tokens
    ctx = [tok(x, add_special_tokens=False)["input_ids"] for x in PROMPTS]
    p, budgets = SamplingParams(max_new_tokens=90, stream=0), [90, 20, 75]
    grown = HFEngine(model, no_eos, seed=5).sample(ctx, p, n=2, max_new=budgets)
    assert hf.decode_cache().layer_class_to_replicate is not DynamicCache().layer_class_to_replicate
    monkeypatch.setattr(hf, "decode_cache", DynamicCache)
    plain = HFEngine(model, no_eos, seed=5).sample(ctx, p, n=2, max_new=budgets)
    for g, budget in enumerate(budgets):
        for a, b in zip(grown[g], plain[g]):
            assert len(a.token_ids) == budget and a.token_ids == b.token_ids and a.finish == b.finish == "length"
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


class NoEosTokenizer(CountingTokenizer):
    eos_token_id = -1


@pytest.mark.parametrize("head", ["lora", "bias", "bf16"])
def test_decode_vocab_projection_is_the_lm_head(tiny_model_dir, head):
    """The decode loop's logits: (W h^T)^T for an fp32 head (a LoRA on the head folded in once,
    the bias added), F.linear for other dtypes; the same logits as the head module's forward."""
    from tinyrl.rollout.hf import _vocab_projection

    torch.manual_seed(0)
    if head == "lora":  # a trained adapter on the head itself: a non-zero delta to fold
        model, _ = load_policy(ModelConfig(name=tiny_model_dir), LoraConfig(r=4, alpha=8, target_modules=["lm_head"]))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.1)
        module = model.get_output_embeddings()
    else:
        module = torch.nn.Linear(16, 50, bias=True).to(torch.float32 if head == "bias" else torch.bfloat16)
        model = type("M", (), {"get_output_embeddings": lambda self: module})()
    dtype = next(module.parameters()).dtype
    h = torch.randn(5, module.in_features, dtype=dtype)
    with torch.no_grad():
        want, got = module(h), _vocab_projection(model)(h)
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.allclose(got.float(), want.float(), atol=1e-5 if dtype == torch.float32 else 1e-2)


def test_rollout_decodes_with_merged_lora_and_leaves_the_base_alone(tiny_model_dir, monkeypatch):
    """The decode loop runs each LoRA linear as one matmul over W + dW: the same draws and logprobs
    (to fp32 rounding) as peft's forward, the base weights bit-for-bit as before, peft's forward
    back afterwards; the copies stay within the byte budget (none on a GPU). DoRA modules keep
    peft's forward."""
    import tinyrl.rollout.hf as hf
    from tinyrl.model import merge_budget, merged_lora_linears

    model, tok = load_policy(ModelConfig(name=tiny_model_dir), LoraConfig(r=4, alpha=8, target_modules="all-linear"))
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.2)  # a trained adapter: dW != 0
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    ctx = [tok(x, add_special_tokens=False)["input_ids"] for x in PROMPTS]
    p = SamplingParams(max_new_tokens=12, stream=0)
    merged = HFEngine(model, tok, seed=3).sample(ctx, p, n=3)
    with merged_lora_linears(model) as n_swapped:
        assert n_swapped == sum(1 for n, _ in model.named_modules() if n.endswith("proj"))
    assert not any("forward" in vars(m) for m in model.modules())
    first = next(m for n, m in model.named_modules() if n.endswith("proj")).base_layer.weight
    for budget, want in ((0, 0), (first.numel() * first.element_size(), 1)):  # the copies stay in budget
        with merged_lora_linears(model, budget=budget) as n_swapped:
            assert n_swapped == want
    assert merge_budget(torch.device("cpu")) > 0 and merge_budget(torch.device("cuda")) == 0
    monkeypatch.setattr(hf, "merged_lora_linears", lambda m, **kw: contextlib.nullcontext(0))
    plain = HFEngine(model, tok, seed=3).sample(ctx, p, n=3)
    for a, b in zip(sum(merged, []), sum(plain, [])):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if "lora_" not in n)
    import peft

    from tinyrl.model import load_base_model, resolve_model

    base_model = load_base_model(ModelConfig(name=tiny_model_dir), resolve_model(tiny_model_dir))
    dora = peft.get_peft_model(base_model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                           use_dora=True))
    with merged_lora_linears(dora) as n_swapped:
        assert n_swapped == 0


@pytest.mark.parametrize("written_out", [True, False], ids=["decode-step", "model-forward"])
def test_contexts_that_open_alike_prefill_their_common_prefix_once(policy, monkeypatch, written_out):
    """Contexts sharing a preamble (a chat template's system prompt) prefill it once, then each its
    own rest: the cache holds [prefix | padding | rest] with its mask moved to match, and the draws
    and logprobs are those of a plain left-padded prefill, through the written-out decode step and
    through the model's own forward alike."""
    import tinyrl.model.forward as model_mod
    import tinyrl.rollout.hf as hf

    model, tok = policy
    if not written_out:
        monkeypatch.setattr(hf.DecodeStep, "of", classmethod(lambda cls, trunk: None))
    monkeypatch.setattr(model_mod, "MIN_SHARED_PREFIX", 1)  # the mechanism at this model's size
    preamble = tok("12+34=46\n5+6=11\n78+9=87\n", add_special_tokens=False)["input_ids"]
    ctx = [preamble + tok(x, add_special_tokens=False)["input_ids"] for x in PROMPTS]
    p = SamplingParams(max_new_tokens=10, stream=0)
    trunk = model.get_base_model().model
    seen = []
    hook = trunk.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    shared = HFEngine(model, tok, seed=4).sample(ctx, p, n=2)
    hook.remove()
    # the preamble once (the prompts differ from their first character on), then each context's rest
    assert seen[0] == (1, len(preamble)) and seen[1][0] == len(ctx)
    monkeypatch.setattr(model_mod, "MIN_SHARED_PREFIX", 10 ** 9)
    plain = HFEngine(model, tok, seed=4).sample(ctx, p, n=2)
    for a, b in zip(sum(shared, []), sum(plain, [])):
        assert a.token_ids == b.token_ids and a.finish == b.finish
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
