"""Local retrievers over a Search-R1-format corpus, and the `search` tool built on them.

A corpus is a jsonl file of `{"id": ..., "contents": "\\"Title\\"\\ntext"}` rows, the format of
Search-R1's wiki-18 and of the shipped search world. Two retrievers:

- `bm25` (default, CPU): `bm25s` over the corpus (or a saved bm25s index directory);
- `dense`: a sentence-transformers encoder (e.g. a local copy of `intfloat/e5-base-v2`) with a
  faiss inner-product index, built from the corpus or loaded from a faiss index file (Search-R1's
  `e5_Flat.index`). Needs `pip install 'tinyrl-rlvr[agents-dense]'`.

The tool returns the top-k passages the way Search-R1 writes them,
`Doc 1(Title: "Title") text\\nDoc 2(...) ...`, or `No results.` when nothing matches. Retrievers
are cached per (kind, corpus, model, index), so the index is built once per process.
"""

from __future__ import annotations

import gzip
import json
import logging
import sys
from pathlib import Path
from typing import Callable

from tinyrl.errors import ConfigError, MissingExtra  # user errors: the CLI prints each as one paragraph

log = logging.getLogger("tinyrl.agents")
NO_RESULTS = "No results."


def split_contents(contents: str) -> tuple[str, str]:
    """`"Title"\\ntext` -> (`"Title"`, `text`); Search-R1 keeps the title's quotes.

    >>> split_contents('"Evan Morris"\\nEvan Morris was a lobbyist.')
    ('"Evan Morris"', 'Evan Morris was a lobbyist.')
    """
    title, _, text = contents.partition("\n")
    return title, text


def format_passages(docs: list[dict]) -> str:
    """Search-R1's `_passages2string`: `Doc i(Title: title) text`, one per line."""
    if not docs:
        return NO_RESULTS
    lines = []
    for i, doc in enumerate(docs):
        title, text = split_contents(doc["contents"])
        lines.append(f"Doc {i + 1}(Title: {title}) {text}")
    return "\n".join(lines) + "\n"


def read_corpus(path: str | Path) -> list[dict]:
    """The corpus rows (`id`, `contents`) of a Search-R1-format jsonl (or .jsonl.gz) file."""
    path = Path(path)
    docs = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{path}, line {i + 1}: not valid JSON ({e}); agent.corpus must be a "
                                  f"Search-R1-format jsonl file") from None
            if not isinstance(row, dict) or "contents" not in row:
                raise ConfigError(f"{path}: row {i} has no 'contents' field (Search-R1 corpus format: "
                                 f'{{"id": ..., "contents": "\\"Title\\"\\ntext"}})')
            docs.append({"id": str(row.get("id", i)), "contents": row["contents"]})
    if not docs:
        raise ConfigError(f"{path}: the corpus is empty")
    return docs


class BM25Retriever:
    """bm25s (Lucene BM25, English stopwords, no stemming) over a list of corpus rows."""

    def __init__(self, docs: list[dict], k1: float = 1.5, b: float = 0.75):
        bm25s = _bm25s()
        self._bm25s = bm25s
        self.docs = docs
        self.index = bm25s.BM25(k1=k1, b=b)
        self.index.index(self._tokenize([d["contents"] for d in docs], ids=True), show_progress=False)

    @classmethod
    def load(cls, index_dir: str | Path) -> "BM25Retriever":
        """A bm25s index saved with `save(dir)` (corpus included)."""
        bm25s = _bm25s()

        self = cls.__new__(cls)
        self._bm25s = bm25s
        self.index = bm25s.BM25.load(str(index_dir), load_corpus=True, show_progress=False)
        self.docs = [{"id": str(d.get("id", i)), "contents": d["contents"] if isinstance(d, dict) else str(d)}
                     for i, d in enumerate(self.index.corpus)]
        self.index.corpus = None  # retrieve() then returns row indices (into self.docs), not corpus entries
        return self

    def save(self, index_dir: str | Path) -> None:
        self.index.save(str(index_dir), corpus=self.docs, show_progress=False)

    def _tokenize(self, texts: list[str], ids: bool):
        return self._bm25s.tokenize(texts, stopwords="en", return_ids=ids, show_progress=False)

    def search(self, queries: list[str], k: int) -> list[list[dict]]:
        """Top-k corpus rows per query, best first; rows that share no term with the query are dropped."""
        k = max(1, min(k, len(self.docs)))
        idx, scores = self.index.retrieve(self._tokenize(list(queries), ids=False), k=k, show_progress=False)
        return [[self.docs[int(i)] for i, s in zip(row, srow) if s > 0] for row, srow in zip(idx, scores)]


class DenseRetriever:
    """A sentence-transformers encoder + faiss inner product (normalised embeddings: cosine)."""

    def __init__(self, docs: list[dict], model: str, index_path: str | None = None,
                 query_prefix: str = "query: ", passage_prefix: str = "passage: ", batch_size: int = 64):
        faiss, SentenceTransformer = _dense_imports()
        self.docs = docs
        self.query_prefix = query_prefix
        self.encoder = SentenceTransformer(model, device=None)
        if index_path is not None:
            self.index = faiss.read_index(str(index_path))
            if self.index.ntotal != len(docs):
                raise ConfigError(f"agent.index: {index_path} holds {self.index.ntotal} vectors, "
                                 f"the corpus {len(docs)} documents")
        else:
            emb = self.encoder.encode([passage_prefix + d["contents"] for d in docs], batch_size=batch_size,
                                      normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            self.index = faiss.IndexFlatIP(emb.shape[1])
            self.index.add(emb.astype("float32"))

    def search(self, queries: list[str], k: int) -> list[list[dict]]:
        k = max(1, min(k, len(self.docs)))
        q = self.encoder.encode([self.query_prefix + x for x in queries], normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        _, idx = self.index.search(q.astype("float32"), k)
        return [[self.docs[int(i)] for i in row if i >= 0] for row in idx]


def _bm25s():
    try:
        import bm25s
    except ImportError as e:
        raise MissingExtra("agent.retriever 'bm25' (the search tool) needs bm25s: pip install 'tinyrl-rlvr[agents]'") from e
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG: keep its notes quiet
    return bm25s


def _dense_imports():
    try:
        import faiss
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise MissingExtra(
            f"agent.retriever 'dense' needs faiss-cpu and sentence-transformers ({e.name} is missing): "
            f"pip install 'tinyrl-rlvr[agents-dense]'") from e
    return faiss, SentenceTransformer


_CACHE: dict[tuple, object] = {}


def get_retriever(kind: str, corpus: str | Path, model: str | None = None, index: str | None = None):
    """The (cached) retriever of `kind` ("bm25" | "dense") over `corpus`."""
    key = (kind, str(corpus), model, index)
    if key in _CACHE:
        return _CACHE[key]
    if kind == "bm25":
        if index is not None or Path(corpus).is_dir():
            ret = BM25Retriever.load(index or corpus)
        else:
            ret = BM25Retriever(read_corpus(_existing(corpus, "agent.corpus")))
    elif kind == "dense":
        if model is None:
            raise ConfigError("agent.retriever 'dense' needs agent.retriever_model: a local sentence-transformers "
                             "model directory (e.g. a copy of intfloat/e5-base-v2) or a hub id")
        ret = DenseRetriever(read_corpus(_existing(corpus, "agent.corpus")), model,
                             _existing(index, "agent.index") if index else None)
    else:
        raise ConfigError(f"agent.retriever: must be 'bm25' or 'dense', got {kind!r}")
    _CACHE[key] = ret
    return ret


def _existing(path, field: str) -> str:
    if not Path(path).exists():
        raise FileNotFoundError(f"{field}: file not found: {path}")
    return str(path)


def make_search_tool(retriever, top_k: int = 3) -> Callable[[str], str]:
    """A TRL-style `search(query)` tool over `retriever`."""

    def search(query: str) -> str:
        """Search the knowledge corpus and return the top matching documents.

        Args:
            query: what to look for, e.g. the name of a person or place.
        """
        return format_passages(retriever.search([query], top_k)[0])

    return search


def corpus_of(agent_cfg, task) -> str:
    """The run's corpus: `agent.corpus`, else the task's own (the shipped search world)."""
    corpus = getattr(agent_cfg, "corpus", None) or getattr(task, "corpus", None)
    if corpus is None:
        raise ConfigError("agent.corpus: the search tool needs a corpus (a Search-R1-format jsonl file, or a "
                          "bm25s index folder); this task has none of its own: set agent.corpus=PATH")
    return str(corpus)


def build_search_tool(agent_cfg, task) -> Callable[[str], str]:
    retriever = get_retriever(getattr(agent_cfg, "retriever", "bm25"), corpus_of(agent_cfg, task),
                              getattr(agent_cfg, "retriever_model", None), getattr(agent_cfg, "index", None))
    return make_search_tool(retriever, getattr(agent_cfg, "top_k", 3))


def main(argv: list[str] | None = None) -> None:
    """`python -m tinyrl.agents.retrieval index CORPUS OUT_DIR`: build and save a bm25s index once
    (for a large corpus such as wiki-18); then set `agent.corpus: OUT_DIR`."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "index":
        raise SystemExit("usage: python -m tinyrl.agents.retrieval index CORPUS.jsonl[.gz] OUT_DIR")
    BM25Retriever(read_corpus(args[1])).save(args[2])
    print(f"bm25s index of {args[1]} saved to {args[2]}")


if __name__ == "__main__":
    main()
