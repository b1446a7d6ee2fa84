"""Shared fixtures: a tiny random Llama with a char-level tokenizer, built once per session.

Nothing here downloads: the model is made from a LlamaConfig and a `tokenizers` WordLevel
vocabulary of the arithmetic task's characters.
"""

import pytest
import torch


def make_tiny_model(path, hidden=64, layers=2, seed=0):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    for c in "0123456789+=\n":
        vocab[c] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", padding_side="left")
    tok.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def make_char_model(path, max_positions=256, seed=0):
    """A random Llama over tiny-arith's printable-ASCII tokenizer with a flat head: every character
    (so any tag character a test's call format stops at) is about equally likely."""
    from importlib import resources

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(resources.files("tinyrl.assets") / "tiny-arith"))
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_positions,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.2)
    model.save_pretrained(path)
    return str(path)


class Recording:
    """An inner rollout engine, recording every sample it hands out (to check ids are kept exactly)."""

    def __init__(self, inner):
        self.inner, self.samples = inner, []

    def sample(self, *a, **kw):
        out = self.inner.sample(*a, **kw)
        self.samples += [s for g in out for s in g]
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-random"))


@pytest.fixture
def run_root(tmp_path):
    return str(tmp_path / "runs")
