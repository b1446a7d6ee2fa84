"""Loaders on synthetic rows in the real formats: Search-R1 / FlashRAG questions and corpus, GAIA metadata."""

import gzip
import json

import pytest

from tinyrl.agents.data import load_gaia, load_qa_rows
from tinyrl.agents.retrieval import format_passages, read_corpus


def _jsonl(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


# FlashRAG's NQ rows (what Search-R1's data scripts download) and Search-R1's prepared rows
FLASHRAG = {"id": "test_0", "question": "who got the first nobel prize in physics",
            "golden_answers": ["Wilhelm Conrad Röntgen"], "metadata": {}}
PREPARED = {"id": "train_7", "question": "total number of death row inmates in the us?",
            "golden_answers": ["2,718"], "data_source": "nq",
            "prompt": [{"role": "user", "content": "Answer the given question. ... Question: total number ...?\n"}],
            "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": ["2,718"]}},
            "extra_info": {"split": "train", "index": 7}}


def test_search_r1_question_rows(tmp_path):
    rows = load_qa_rows(_jsonl(tmp_path / "nq.jsonl", [FLASHRAG, PREPARED]))
    assert rows[0] == {"id": "test_0", "question": "who got the first nobel prize in physics?",
                       "golden_answers": ["Wilhelm Conrad Röntgen"], "metadata": {}}
    assert rows[1]["golden_answers"] == ["2,718"] and rows[1]["data_source"] == "nq"
    only_target = {k: v for k, v in PREPARED.items() if k != "golden_answers"}
    assert load_qa_rows(_jsonl(tmp_path / "p.jsonl.gz", [only_target], gz=True))[0]["golden_answers"] == ["2,718"]


def test_search_r1_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow (it comes with the dev extra's datasets)")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"id": "1", "question": "q", "golden_answers": ["a", "b"]}]),
                   tmp_path / "train.parquet")
    assert load_qa_rows(tmp_path / "train.parquet")[0]["golden_answers"] == ["a", "b"]


def test_bad_question_rows_name_the_file_and_row(tmp_path):
    with pytest.raises(ValueError, match=r"row 0: no 'question' field"):
        load_qa_rows(_jsonl(tmp_path / "a.jsonl", [{"query": "x"}]))
    with pytest.raises(ValueError, match=r"row 0: no 'golden_answers'"):
        load_qa_rows(_jsonl(tmp_path / "b.jsonl", [{"question": "x"}]))
    (tmp_path / "c.jsonl").write_text('{"question": "x", "golden_answers": ["y"]}\nnot json\n')
    with pytest.raises(ValueError, match=r"line 2 is not JSON"):
        load_qa_rows(tmp_path / "c.jsonl")
    with pytest.raises(FileNotFoundError):
        load_qa_rows(tmp_path / "missing.jsonl")


def test_search_r1_corpus_rows(tmp_path):
    path = _jsonl(tmp_path / "wiki.jsonl", [
        {"id": "0", "contents": "\"Evan Morris\"\nEvan Morris Evan L. Morris (January 26, 1977) was a lobbyist."},
        {"id": "1", "contents": "\"Horatio Hale\"\nconsisted of an Algonkin vocabulary."}])
    docs = read_corpus(path)
    assert format_passages(docs) == ('Doc 1(Title: "Evan Morris") Evan Morris Evan L. Morris (January 26, 1977) was '
                                     'a lobbyist.\nDoc 2(Title: "Horatio Hale") consisted of an Algonkin vocabulary.\n')
    with pytest.raises(ValueError, match="no 'contents' field"):
        read_corpus(_jsonl(tmp_path / "bad.jsonl", [{"id": "0", "text": "x"}]))


def test_one_loader_serves_the_shipped_world_and_search_r1_data(tmp_path):
    from tinyrl.tasks import get_task

    task = get_task("search_qa")
    _jsonl(tmp_path / "train.jsonl", [FLASHRAG, PREPARED])
    _jsonl(tmp_path / "test.jsonl", [FLASHRAG])
    train, held = task.build(10, 10, train_path=str(tmp_path / "train.jsonl"), eval_path=str(tmp_path / "test.jsonl"))
    assert len(train) == 2 and len(held) == 1
    assert held[0]["prompt"].startswith("Answer the given question.")
    assert held[0]["prompt"].endswith("Question: who got the first nobel prize in physics?\n")
    assert task.is_correct("<answer> Wilhelm Conrad Röntgen </answer>", held[0])
    w_train, w_held = task.build(10, 10, seed=1, template="plain", hops=2)
    assert all(r["hops"] == 2 and r["prompt"].startswith("Question: ") for r in w_train + w_held)
    assert task.build(10, 10, seed=1, template="plain", hops=2) == (w_train, w_held)  # seeded
    with pytest.raises(ValueError, match="template: must be one of"):
        task.build(1, 1, template="fancy")


GAIA_ROWS = [
    {"task_id": "c61d22de-5f6c-4958-a7f6-5e9707bd3466", "Question": "How many studio albums were published?",
     "Level": 1, "Final answer": "3", "file_name": "",
     "Annotator Metadata": {"Steps": "1. search", "Number of steps": "1", "Tools": "web browser"}},
    {"task_id": "32102e3e-d12a-4209-9163-7b3a104efe5d", "Question": "What is the cheapest item in the sheet?",
     "Level": "2", "Final answer": "1200.50", "file_name": "32102e3e-d12a-4209-9163-7b3a104efe5d.xlsx",
     "Annotator Metadata": {}},
    {"task_id": "test-0001", "Question": "A test-split question", "Level": 3, "Final answer": "?", "file_name": ""},
]


def test_gaia_metadata_rows(tmp_path):
    _jsonl(tmp_path / "metadata.jsonl", GAIA_ROWS)
    rows = load_gaia(tmp_path)  # the folder, or the file itself
    assert rows == load_gaia(tmp_path / "metadata.jsonl")
    assert rows[0]["question"] == "How many studio albums were published?"
    assert rows[0]["golden_answers"] == ["3"] and rows[0]["level"] == 1 and rows[0]["file_path"] is None
    assert rows[1]["level"] == 2 and rows[1]["file_path"] == str(tmp_path / GAIA_ROWS[1]["file_name"])
    assert rows[2]["golden_answers"] == []  # the test split hides its answers
    with pytest.raises(ValueError, match=r"no \['Question'\]"):
        load_gaia(_jsonl(tmp_path / "bad.jsonl", [{"task_id": "x"}]))


def test_gaia_task_scores_with_the_official_scorer(tmp_path):
    from tinyrl.tasks import get_task

    _jsonl(tmp_path / "metadata.jsonl", GAIA_ROWS)
    task = get_task("gaia")
    train, held = task.build(0, 0, path=str(tmp_path / "metadata.jsonl"))
    assert train == [] and [r["task_id"] for r in held] == [GAIA_ROWS[0]["task_id"], GAIA_ROWS[1]["task_id"]]
    # a numeric ground truth: the answer's $ , % are stripped and compared as a number
    assert task.is_correct("<answer>$1,200.5</answer>", held[1]) and not task.is_correct("<answer>1200</answer>", held[1])
    assert task.is_correct("FINAL ANSWER: 3", held[0])
    with pytest.raises(ValueError, match="task_args.path"):
        task.build(0, 0)
