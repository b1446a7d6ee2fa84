"""The written-out decode step (tinyrl.rollout.decode_step) against each model family's own forward,
and the decode loop's dequantised 4-bit linears against bitsandbytes' forward."""

import contextlib

import pytest
import torch

from tinyrl.config import LoraConfig, ModelConfig
from tinyrl.model import cache_kwarg, load_policy, merged_lora_linears, trunk_of
from tinyrl.rollout.base import SamplingParams
from tinyrl.rollout.decode_step import DecodeStep
from tinyrl.rollout.hf import HFEngine, _prefill

CONTEXTS = [[3, 4, 5, 6, 7, 8, 9], [5, 6, 7], [10, 11, 12, 3, 4]]  # different lengths: left padding matters


def family(kind: str, **extra):
    """A tiny random causal LM of one family: GQA (2 key/value heads for 4 query heads), 2 layers."""
    import transformers

    common = dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                  bos_token_id=None, tie_word_embeddings=False)
    cfg_cls, model_cls = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "llama_rope_scaled": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
    }[kind]
    if kind == "llama_rope_scaled":
        common["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    if kind == "mistral":
        common["sliding_window"] = None
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**{**common, **extra})).eval()
    return model


class _Tok:
    pad_token_id = 0


def hidden_states_both_ways(model, steps: int = 6):
    """Final hidden states of `steps` decode steps over left-padded rows (2 samples per context, as the
    rollout's prompt-major rows), through the model's forward and through DecodeStep, each on its own
    cache; the second row of each context is dropped half-way, as a finished row leaves the batch."""
    trunk = trunk_of(model)
    fast = DecodeStep.of(trunk)
    assert fast is not None
    kw = cache_kwarg(trunk)
    out = []
    with torch.no_grad():
        for step in (None, fast):
            cache, attn, cur, pos = _prefill(trunk, _Tok(), CONTEXTS, 2, "cpu")
            hs = []
            g = torch.Generator().manual_seed(0)
            for s in range(steps):
                attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], 1)
                if step is None:
                    h = trunk(input_ids=cur, attention_mask=attn, position_ids=pos[:, None], use_cache=True,
                              **{kw: cache}).last_hidden_state[:, -1]
                else:
                    h = step(cur, attn, pos, cache)
                hs.append(h)
                cur, pos = torch.randint(2, 32, (cur.shape[0], 1), generator=g), pos + 1
                if s == steps // 2:  # rows 1, 3, 5 finish
                    keep = torch.arange(0, cur.shape[0], 2)
                    cache.batch_select_indices(keep)
                    attn, cur, pos = attn[keep], cur[keep], pos[keep]
            out.append(hs)
    return out


@pytest.mark.parametrize("kind", ["llama", "llama_rope_scaled", "qwen2", "qwen3", "mistral"])
def test_the_written_out_step_is_the_models_own_decode_step(kind):
    """Every step's final hidden states equal the model's forward over the same cache (to fp32
    rounding), for each supported family: GQA, rope scaling, Qwen2's q/k/v biases, Qwen3's per-head
    q/k norms, left padding, rows leaving the batch."""
    model = family(kind)
    with torch.no_grad():  # non-trivial norm weights and biases, so a skipped one would show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    plain, fast = hidden_states_both_ways(model)
    for a, b in zip(plain, fast):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), float((a - b).abs().max())


def test_the_step_runs_lora_linears_merged_or_through_peft():
    """Under a LoRA adapter (on Qwen2: biased q/k/v) the step gives peft's decode step, with the
    adapted linears run merged (inside merged_lora_linears) or through peft's forward (a zero
    budget merges none)."""
    import peft

    model = peft.get_peft_model(family("qwen2"), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or name.endswith("bias"):
                p.normal_(0, 0.3)
    peft_steps, _ = hidden_states_both_ways(model)
    for budget in (None, 0):
        with merged_lora_linears(model, budget=budget) as n:
            assert (n > 0) == (budget is None)
            _, fast = hidden_states_both_ways(model)
        for a, b in zip(peft_steps, fast):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind, extra", [
    ("mistral", {"sliding_window": 4}),  # a sliding window: the written-out attention is full
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
])
def test_other_attention_decodes_through_the_model(kind, extra):
    assert DecodeStep.of(trunk_of(family(kind, **extra))) is None


def test_the_engine_draws_the_same_samples_either_way(tiny_model_dir, monkeypatch):
    """HFEngine with the written-out step draws what it draws through the model's forward (same ids,
    logprobs to fp32 rounding), and the CPU rollout does use the written-out step."""
    import tinyrl.rollout.hf as hf

    model, tok = load_policy(ModelConfig(name=tiny_model_dir), LoraConfig(r=4, alpha=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    ctx = [tok(x, add_special_tokens=False)["input_ids"] for x in ["1+2=", "34+56=", "7+8="]]
    params = SamplingParams(max_new_tokens=12, stream=0)
    made = []
    monkeypatch.setattr(hf, "DecodeStep", type("Counting", (DecodeStep,), {
        "of": classmethod(lambda cls, trunk: made.append(1) or DecodeStep.of(trunk))}))
    fast = HFEngine(model, tok, seed=3).sample(ctx, params, n=3)
    assert made
    monkeypatch.setattr(hf.DecodeStep, "of", classmethod(lambda cls, trunk: None))
    plain = HFEngine(model, tok, seed=3).sample(ctx, params, n=3)
    for a, b in zip(sum(fast, []), sum(plain, [])):
        assert a.token_ids == b.token_ids and a.finish == b.finish
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_the_decode_loop_runs_4bit_linears_dequantised_once(tiny_model_dir, monkeypatch):
    """dequantize=True: every 4-bit linear, bare or under LoRA, runs as one F.linear over its
    dequantised weight (+ dW), giving bitsandbytes' own output (bit for bit where bare, to fp32
    rounding under LoRA); within the byte budget; off by default (the no-grad scoring passes, which
    run each weight once per forward anyway). The engine's samples are those of peft's forward."""
    import tinyrl.rollout.hf as hf

    model, tok = load_policy(ModelConfig(name=tiny_model_dir, load_in_4bit=True),
                             LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    quantized = {n: m for n, m in model.named_modules() if hasattr(getattr(m, "weight", None), "quant_state")
                 and not hasattr(m, "base_layer")}
    lora = {n for n, m in model.named_modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")}
    assert quantized and lora
    torch.manual_seed(1)
    width = {n: m.weight.quant_state.shape[1] for n, m in quantized.items()}
    x = {n: torch.randn(3, width.get(n) or width[n + ".base_layer"]) for n in list(quantized) + sorted(lora)}
    with torch.no_grad():
        want = {n: m(x[n]) for n, m in model.named_modules() if n in x}
        with merged_lora_linears(model) as n_default:
            assert n_default == 0  # 4-bit bases are left to bitsandbytes unless asked
        with merged_lora_linears(model, dequantize=True) as n:
            assert n == len(quantized)  # a LoRA module and its base count once
            got = {name: m(x[name]) for name, m in model.named_modules() if name in want}
        for name in want:
            if name in lora:
                assert torch.allclose(got[name], want[name], atol=1e-5), name
            elif not any(name.startswith(k + ".") for k in lora):
                assert torch.equal(got[name], want[name]), name
        one = next(iter(quantized.values())).weight.quant_state.shape
        with merged_lora_linears(model, budget=one[0] * one[1] * 4, dequantize=True) as n:
            assert n == 1
    ctx = [tok(s, add_special_tokens=False)["input_ids"] for s in ["1+2=", "34+56="]]
    params = SamplingParams(max_new_tokens=10, stream=0)
    deq = HFEngine(model, tok, seed=5).sample(ctx, params, n=2)
    monkeypatch.setattr(hf, "merged_lora_linears", lambda m, **kw: contextlib.nullcontext(0))
    plain = HFEngine(model, tok, seed=5).sample(ctx, params, n=2)
    for a, b in zip(sum(deq, []), sum(plain, [])):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
