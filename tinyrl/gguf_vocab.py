"""A transformers tokenizer as GGUF metadata: the vocabulary, its merges, special tokens, the chat template.

llama.cpp rebuilds the tokenizer from these keys (`tokenizer.ggml.*`, `tokenizer.chat_template`), so what
is written here decides how llama.cpp, Ollama and LM Studio cut text into the model's tokens. Three
kinds of tokenizer.json are written, following llama.cpp's converter (convert_hf_to_gguf.py):

- byte-level BPE (GPT-2, SmolLM2, Qwen2/2.5/3, Llama 3, Mistral's tekken): `tokenizer.ggml.model` gpt2,
  the tokens as tokenizer.json spells them, the merges, and `tokenizer.ggml.pre`, the name llama.cpp
  gives the pre-tokenizer (its split regex) -- read from the base's own GGUF when the base was one, else
  recognised from tokenizer.json's pre-tokenizer (transformers' table of llama.cpp names and regexes);
- sentencepiece-style BPE with byte fallback (Llama 2, Mistral 7B): `llama`, through `gguf.LlamaHfVocab`;
- a character-level WordLevel vocabulary (the tiny models): written as byte-level BPE whose merges never
  fire, which llama.cpp tokenizes one character per token exactly like the WordLevel model. (llama.cpp
  needs a merges key and GGUF has no empty arrays, so the one merge joins two symbols that cannot occur.
  transformers cannot rebuild this tokenizer from the file: use the merged folder there.)

Anything else is refused, naming the tokenizer's model type and pre-tokenizer.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tinyrl.errors import ConfigError

INERT_MERGE = "ĠĠ ĠĠ"  # "ĠĠ" is no single character, and no other merge makes it: this merge never fires


def byte_spelling(text: str, byte_encoder: dict[int, str]) -> str:
    """A raw token as byte-level BPE spells it: each UTF-8 byte as its printable stand-in (" " -> "Ġ")."""
    return "".join(byte_encoder[b] for b in text.encode("utf-8"))


def _looks_special(token: str) -> bool:
    """What llama.cpp's converter marks CONTROL though the tokenizer calls it plain (<|...|>, <pad>)."""
    return token in ("<pad>", "<mask>") or (token.startswith("<|") and token.endswith("|>"))


def _token_types(gguf, tok, vocab_size: int, spell=None) -> tuple[list[str], list[int]]:
    """tokens and types for ids 0..vocab_size-1 (convert_hf_to_gguf's get_vocab_base): the tokenizer's added
    tokens CONTROL when special, USER_DEFINED otherwise; ids it lacks [PAD<id>] UNUSED. `spell` rewrites
    the plain tokens (a WordLevel vocabulary into byte-level spelling)."""
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added, decoder = tok.get_added_vocab(), tok.added_tokens_decoder
    if reverse and max(reverse) >= vocab_size:
        raise ConfigError(f"--gguf: the tokenizer has token id {max(reverse)}, past the model's vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif token in added:
            if decoder[i].special or _looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:  # llama.cpp matches user-defined tokens in the text as written, spaces and all
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
            tokens.append(token)
        else:
            tokens.append(spell(token) if spell else token)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def _split_names() -> dict[str, str]:
    """{split regex: llama.cpp's pre-tokenizer name}, from transformers' own table (first name wins)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:  # an older transformers: only the ByteLevel-only forms below are recognised
        return {}
    names: dict[str, str] = {}
    for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items():
        names.setdefault(regex, name)
    return names


def pre_tokenizer_name(tokenizer_json: dict, base_pre: str | None = None) -> str:
    """`tokenizer.ggml.pre`: how llama.cpp splits text before the merges (its llama-vocab.cpp regexes)."""
    if base_pre:
        return base_pre
    pre = tokenizer_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        regex = (parts[0].get("pattern") or {}).get("Regex")
        if regex in (names := _split_names()):
            return names[regex]
    raise ConfigError(f"--gguf: the tokenizer's pre-tokenizer {json.dumps(pre)[:300]} is not one llama.cpp names "
                      f"(tokenizer.ggml.pre): llama.cpp would cut text differently from the model's tokenizer")


def _add_byte_level(gguf, writer, tok, tj: dict, vocab_size: int, base_pre: str | None) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(tj, base_pre))
    tokens, types = _token_types(gguf, tok, vocab_size)
    writer.add_token_list(tokens)
    writer.add_token_types(types)


def _add_char_level(gguf, writer, tok, vocab_size: int) -> None:
    encoder = gguf.vocab.bytes_to_unicode()
    tokens, types = _token_types(gguf, tok, vocab_size, spell=lambda t: byte_spelling(t, encoder))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")  # with no merges the split cannot change a token
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([INERT_MERGE])


def _add_sentencepiece_style(gguf, writer, folder: Path, vocab_size: int) -> None:
    vocab = gguf.LlamaHfVocab(folder)
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    for i in range(len(tokens), vocab_size):  # ids past the tokenizer's (a padded embedding)
        tokens.append(f"[PAD{i}]".encode())
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)


def add_tokenizer(writer, tok, config, base_pre: str | None = None) -> str:
    """Write `tok` (a transformers fast tokenizer) into `writer`'s metadata for a model of `config`;
    returns the kind written ("byte-level BPE", "sentencepiece-style BPE", "character-level")."""
    import gguf

    vocab_size = config.get_text_config().vocab_size
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        tok.save_pretrained(folder)
        config.to_json_file(folder / "config.json")  # special token ids it names fill the tokenizer's gaps
        tj = json.loads((folder / "tokenizer.json").read_text()) if (folder / "tokenizer.json").is_file() else {}
        model = tj.get("model") or {}
        decoder = (tj.get("decoder") or {}).get("type")
        plain = [t for t in tok.get_vocab() if t not in tok.get_added_vocab()]
        if model.get("type") == "BPE" and not model.get("byte_fallback") and decoder == "ByteLevel":
            kind, merges = "byte-level BPE", True
            _add_byte_level(gguf, writer, tok, tj, vocab_size, base_pre)
        elif model.get("type") == "BPE" and model.get("byte_fallback"):
            kind, merges = "sentencepiece-style BPE", False
            _add_sentencepiece_style(gguf, writer, folder, vocab_size)
        elif model.get("type") == "WordLevel" and all(len(t) == 1 for t in plain):
            kind, merges = "character-level", False
            _add_char_level(gguf, writer, tok, vocab_size)
        else:
            raise ConfigError(f"--gguf: a {model.get('type') or type(tok).__name__} tokenizer (decoder {decoder}) "
                              f"has no llama.cpp tokenizer to write; supported: byte-level BPE, sentencepiece-style "
                              f"BPE (byte fallback) and character-level WordLevel")
        special = gguf.SpecialVocab(folder, load_merges=merges, n_vocab=vocab_size)
    for typ in ("bos", "eos", "unk", "pad"):  # the tokenizer's own ids where the files named none
        tid = getattr(tok, f"{typ}_token_id", None)
        if isinstance(tid, int) and typ not in special.special_token_ids:
            special.special_token_ids[typ] = tid
    probe = tok("a")["input_ids"]  # does the tokenizer add BOS / EOS itself? llama.cpp should do the same
    special.add_special_token["bos"] = tok.bos_token_id is not None and probe[:1] == [tok.bos_token_id]
    adds_eos = tok.eos_token_id is not None and probe[-1:] == [tok.eos_token_id]
    if adds_eos or "eos" in special.add_special_token:  # (llama.cpp's default is no EOS; unsaid, as the converter)
        special.add_special_token["eos"] = adds_eos
    if special.chat_template is None and getattr(tok, "chat_template", None):
        special.chat_template = tok.chat_template
    special.add_to_gguf(writer, quiet=True)
    return kind
