"""The search world: deterministic for a seed, split by person, shipped files match the generator,
the retriever finds each person's document, the tiny model's tokenizer encodes every observation."""

import json
import random
import re
from importlib import resources

import pytest

from tinyrl.agents.data import load_qa_rows
from tinyrl.agents.retrieval import BM25Retriever, format_passages, read_corpus, split_contents
from tinyrl.agents.world import QUESTIONS, WorldSpec, corpus, make_world, questions, read_world, write_world

WORLD = resources.files("tinyrl.assets") / "search-world"


def _bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_seed_same_bytes_other_seed_other_world(tmp_path):
    small = WorldSpec(seed=3, n_people=60)
    a, b = write_world(make_world(small), tmp_path / "a"), write_world(make_world(small), tmp_path / "b")
    assert _bytes(a["corpus"].parent) == _bytes(b["corpus"].parent)
    other = make_world(WorldSpec(seed=4, n_people=60))
    assert [p.name for p in other.people] != [p.name for p in make_world(small).people]


def test_the_shipped_world_is_the_generators_seed_0(tmp_path):
    paths = write_world(make_world(WorldSpec(seed=0)), tmp_path)
    for path in paths.values():
        assert path.read_bytes() == (WORLD / path.name).read_bytes(), f"{path.name} differs: re-run make_search_world"


def test_split_is_by_person_and_closed_over_teachers():
    world = read_world(WORLD)
    people = world.by_name()
    held = {p.name for p in world.people if p.split == "test"}
    train = {p.name for p in world.people if p.split == "train"}
    assert held and train and not held & train
    assert len(held) == round(len(world.people) * world.spec.held_out_share)
    for p in world.people:  # a chain never crosses the split
        assert people[p.teacher].split == p.split and p.teacher != p.name
    train_q = load_qa_rows(WORLD / "train.jsonl")
    test_q = load_qa_rows(WORLD / "test.jsonl")
    assert {r["metadata"]["entity"] for r in test_q} == held
    assert len(train_q) == len(QUESTIONS) * len(train) and len(test_q) == len(QUESTIONS) * len(held)
    train_text = " ".join(r["question"] + " " + " ".join(r["golden_answers"]) for r in train_q)
    assert not [n for n in held if n in train_text]  # no held-out person in a train question or answer
    # every name token of a held-out person is a name token of some train person (so it was trained on)
    train_tokens = {t for n in train for t in n.split()}
    assert all(t in train_tokens for n in held for t in n.split())


def test_questions_answer_from_the_documents():
    world = read_world(WORLD)
    docs = {split_contents(d["contents"])[0].strip('"'): d["contents"] for d in read_corpus(WORLD / "corpus.jsonl")}
    assert len(docs) == len(world.people)
    people = world.by_name()
    for r in load_qa_rows(WORLD / "test.jsonl"):
        subject = r["metadata"]["entity"]
        if r["metadata"]["hops"] == 2:
            assert people[subject].teacher in docs[subject]  # the bridge is in the first document ...
            subject = people[subject].teacher
        assert r["golden_answers"][0] in docs[subject]  # ... and the answer in the subject's


def test_bm25_finds_every_persons_document_first():
    world = read_world(WORLD)
    ret = BM25Retriever(read_corpus(WORLD / "corpus.jsonl"))
    names = [p.name for p in world.people]
    hits = ret.search(names, 3)
    assert all(h[0]["contents"].startswith(f'"{n}"\n') for n, h in zip(names, hits))
    assert ret.search(["zzz qqq"], 3) == [[]]  # nothing shares a term: no results
    text = format_passages(hits[0])
    assert re.fullmatch(r'(Doc [123]\(Title: "[A-Za-z ]+"\) [^\n]+\n){3}', text)


def test_pretraining_text_has_no_held_out_person():
    """The episodes of scripts/pretrain_tiny_search.py (their observations included) never show a
    held-out person: they search a BM25 index of the train side only."""
    import argparse
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "pretrain_tiny_search", Path(__file__).resolve().parents[2] / "scripts" / "pretrain_tiny_search.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from tinyrl.tasks import get_task

    world, docs = read_world(WORLD), read_corpus(WORLD / "corpus.jsonl")
    train_rows, _ = get_task("search_qa").build(10**9, 0, template="plain")
    args = argparse.Namespace(p_search=1.0, p_good_query=0.5, p_retry=0.5, p_second=0.5, max_searches=3, top_k=[3])
    episodes = mod.Episodes(world, train_rows, docs, args)
    rng = random.Random(0)
    text = "\n".join(t for _ in range(300) for _, t in episodes.sample(rng))
    held = [p.name for p in world.people if p.split == "test"]
    assert "<information>" in text and not [n for n in held if n in text]


def test_redrawn_invented_people_get_new_facts_and_never_a_held_out_name():
    """`--redraw` (the default): each redraw of the pretraining-only people brings new names and new
    facts (nothing to memorise), the train-side people stay as they are, and still no held-out person
    appears in the episodes."""
    import argparse
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "pretrain_tiny_search", Path(__file__).resolve().parents[2] / "scripts" / "pretrain_tiny_search.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from tinyrl.tasks import get_task

    world, docs = read_world(WORLD), read_corpus(WORLD / "corpus.jsonl")
    train_rows, _ = get_task("search_qa").build(10**9, 0, template="plain")
    args = argparse.Namespace(p_search=1.0, p_good_query=1.0, p_retry=0.5, p_second=0.5, max_searches=3, top_k=[2],
                              invented=200, seed=0, redraw=True)
    episodes = mod.Episodes(world, train_rows, docs, args)
    train, known = {p.name for p in world.people if p.split == "train"}, {p.name for p in world.people}
    first = {n: p for n, p in episodes.people.items() if n not in known}
    episodes.redraw()
    second = {n: p for n, p in episodes.people.items() if n not in known}
    assert len(first) == len(second) == 200
    assert 0 < len(set(first) & set(second)) < 100  # new name pairs (the pools are finite: some recur)
    same = [n for n in set(first) & set(second) if (first[n].born, first[n].job) == (second[n].born, second[n].job)]
    assert len(same) <= 2  # a name drawn twice gets new facts
    assert {n: episodes.people[n] for n in train} == {n: p for n, p in world.by_name().items() if n in train}
    rng = random.Random(0)
    text = "\n".join(t for _ in range(300) for _, t in episodes.sample(rng))
    held = [p.name for p in world.people if p.split == "test"]
    assert any(n in text for n in second) and not [n for n in held if n in text]


def test_tiny_search_tokenizer_encodes_every_observation():
    from transformers import AutoTokenizer

    from tinyrl.agents.formats import SearchR1Format
    from tinyrl.agents.tools import ERROR_KINDS, ToolResult, error_text

    tok = AutoTokenizer.from_pretrained(str(resources.files("tinyrl.assets") / "tiny-search"))
    fmt = SearchR1Format()
    docs = read_corpus(WORLD / "corpus.jsonl")
    texts = [fmt.observation([ToolResult(format_passages(docs[i:i + 3]))]) for i in range(0, len(docs), 3)]
    texts += [fmt.observation([ToolResult(error_text(k, names))]) for k in ERROR_KINDS for names in ([], ["search"])]
    texts += [fmt.observation([ToolResult(format_passages([]))])]
    texts += [r["question"] for r in json.loads("[" + ",".join((WORLD / "test.jsonl").read_text().split("\n")[:-1]) + "]")]
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids, t
    # each piece encodes on its own exactly as inside the joined text: splicing never changes ids
    a, b = "<search> Bales Bavax </search>", texts[0]
    assert tok(a + b, add_special_tokens=False)["input_ids"] == (
        tok(a, add_special_tokens=False)["input_ids"] + tok(b, add_special_tokens=False)["input_ids"])


def test_world_spec_errors():
    with pytest.raises(ValueError, match="exceeds"):
        make_world(WorldSpec(n_people=10_000))
    with pytest.raises(ValueError, match="at least two people"):
        make_world(WorldSpec(n_people=2, held_out_share=0.5))


def test_corpus_and_questions_in_memory_match_the_files():
    world = make_world(WorldSpec(seed=0))
    assert corpus(world)[0] == read_corpus(WORLD / "corpus.jsonl")[0]
    assert questions(world, "test")[0]["question"] == load_qa_rows(WORLD / "test.jsonl")[0]["question"]
