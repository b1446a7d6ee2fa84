"""Retrievers: BM25 on the world (and a saved bm25s index), the dense path on a local encoder, the python tool."""

from importlib import resources

import pytest

from tinyrl.agents.retrieval import BM25Retriever, get_retriever, make_search_tool, read_corpus

WORLD = resources.files("tinyrl.assets") / "search-world"


def test_search_tool_returns_the_right_document_for_a_world_query():
    tool = make_search_tool(get_retriever("bm25", WORLD / "corpus.jsonl"), top_k=3)
    text = tool("Bales Bavax")
    first = text.split("\n")[0]
    assert first.startswith('Doc 1(Title: "Bales Bavax") ') and "was born in" in first
    assert text.count("\nDoc ") == 2 and tool("zzz") == "No results."
    assert get_retriever("bm25", WORLD / "corpus.jsonl") is get_retriever("bm25", WORLD / "corpus.jsonl")  # cached


def test_bm25_index_saved_and_loaded(tmp_path):
    docs = read_corpus(WORLD / "corpus.jsonl")
    BM25Retriever(docs).save(tmp_path / "idx")
    loaded = get_retriever("bm25", tmp_path / "idx")  # a directory: a saved bm25s index
    assert loaded.search(["Bales Bavax"], 1)[0][0]["contents"].startswith('"Bales Bavax"')


def test_dense_retriever_on_a_local_encoder(tmp_path):
    """faiss-cpu + sentence-transformers (the agents-dense extra, in dev). The encoder is a tiny random
    BERT saved locally: no download; with random weights only the exact text is its own nearest neighbour."""
    pytest.importorskip("faiss", reason="the dense retriever needs faiss-cpu: pip install 'tinyrl-rlvr[agents-dense]'")
    st = pytest.importorskip("sentence_transformers",
                             reason="the dense retriever needs sentence-transformers: pip install 'tinyrl-rlvr[agents-dense]'")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    docs = read_corpus(WORLD / "corpus.jsonl")[:40]
    words = sorted({w for d in docs for w in d["contents"].replace('"', " ").replace(".", " ").split()})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(tmp_path / "enc")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=128)).save_pretrained(tmp_path / "enc")
    try:  # sentence-transformers >= 6 (its `models` module is deprecated there)
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # 3-5
        from sentence_transformers.models import Pooling, Transformer
    encoder = st.SentenceTransformer(modules=[Transformer(str(tmp_path / "enc")), Pooling(64, "mean")])
    encoder.save(str(tmp_path / "st"))

    from tinyrl.agents.retrieval import DenseRetriever

    ret = DenseRetriever(docs, str(tmp_path / "st"), query_prefix="", passage_prefix="")
    hits = ret.search([docs[7]["contents"], docs[23]["contents"]], 2)
    assert [h[0]["id"] for h in hits] == [docs[7]["id"], docs[23]["id"]] and all(len(h) == 2 for h in hits)

    import faiss

    faiss.write_index(ret.index, str(tmp_path / "flat.index"))  # a prebuilt index (Search-R1's e5_Flat.index role)
    again = DenseRetriever(docs, str(tmp_path / "st"), index_path=str(tmp_path / "flat.index"), query_prefix="")
    assert again.search([docs[7]["contents"]], 1)[0][0]["id"] == docs[7]["id"]
    with pytest.raises(ValueError, match="holds 40 vectors, the corpus 39"):
        DenseRetriever(docs[:39], str(tmp_path / "st"), index_path=str(tmp_path / "flat.index"))


def test_dense_without_its_extra_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_faiss(name, *a, **k):
        if name == "faiss":
            raise ImportError("No module named 'faiss'", name="faiss")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_faiss)
    from tinyrl.agents.retrieval import _dense_imports

    with pytest.raises(ImportError, match=r"pip install 'tinyrl-rlvr\[agents-dense\]'"):
        _dense_imports()


def test_python_tool_runs_in_the_sandbox():
    from tinyrl.agents.tools import Toolbox, ToolCall, resolve_tool

    box = Toolbox([resolve_tool("python", None)])
    assert box.schemas()[0]["function"]["parameters"]["required"] == ["code"]
    assert box.call(ToolCall("python", {"code": "print(6 * 7)"})).text == "42"


@pytest.mark.slow
def test_python_tool_failures():
    """Slow: each call starts a fresh sandboxed interpreter, one of them runs into its time limit."""
    from tinyrl.agents.python_tool import make_python_tool

    py = make_python_tool(timeout=3.0)
    assert py("x = (").startswith("Error: SyntaxError")
    assert py("x = 1") == "(no output)"
    assert py("while True: pass") == "Error: the program ran longer than 3 seconds."


def test_bm25_without_its_extra_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_bm25s(name, *a, **k):
        if name == "bm25s":
            raise ImportError("No module named 'bm25s'", name="bm25s")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_bm25s)
    with pytest.raises(ImportError, match=r"pip install 'tinyrl-rlvr\[agents\]'"):
        BM25Retriever([{"id": "0", "contents": '"A"\na'}])
