"""The gsm8k task: local files in openai/gsm8k's format (made here; the dataset is not shipped)."""

import json

import pytest

from tinyrl.config import load_config
from tinyrl.data import load_rows
from tinyrl.errors import ConfigError

ROWS = [{"question": f"Tom has {i} apples and buys {i + 2} more. How many apples does he have?",
         "answer": f"He has {i} + {i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2} apples.\n#### {2 * i + 2}"}
        for i in range(200)]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def data_cfg(path, **kw):
    over = {"data.task": "gsm8k", "data.task_args": {"path": str(path)}, "data.num_train": 50, "data.num_eval": 5}
    return load_config(None, {**over, **kw})[1].data


def test_folder_with_train_and_test_files(tmp_path):
    main = tmp_path / "main"
    main.mkdir()
    write(main / "train-00000-of-00001.jsonl", ROWS[:150])
    write(main / "test-00000-of-00001.jsonl", ROWS[150:])
    train, held, task = load_rows(data_cfg(tmp_path))
    assert len(train) == 50 and len(held) == 5
    assert {r["question"] for r in held} <= {r["question"] for r in ROWS[150:]}
    r = train[0]
    assert r["prompt"].startswith(r["question"]) and "\\boxed{}" in r["prompt"]
    assert r["gold"] == r["answer"].rsplit("#### ", 1)[1]
    assert task.is_correct(f"so \\boxed{{{r['gold']}}}", r) and not task.is_correct("\\boxed{-1}", r)
    assert task.reward([r["prompt"]] * 2, [f"\\boxed{{{r['gold']}.0}}", "no idea"],
                       **{k: [v, v] for k, v in r.items()}) == [1.0, 0.0]
    again, _, _ = load_rows(data_cfg(tmp_path))
    assert [x["question"] for x in again] == [x["question"] for x in train]  # seeded


def test_lone_train_file_holds_out_a_fixed_hash_split(tmp_path):
    f = write(tmp_path / "train.jsonl", ROWS)
    train, held, _ = load_rows(data_cfg(f, **{"data.num_train": 1000, "data.num_eval": 1000}))
    tq, hq = {r["question"] for r in train}, {r["question"] for r in held}
    assert tq.isdisjoint(hq) and len(tq) + len(hq) == len(ROWS) and 0 < len(hq) < len(ROWS) // 5


def test_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(ROWS[:40]), tmp_path / "train.parquet")
    train, _, _ = load_rows(data_cfg(tmp_path / "train.parquet", **{"data.num_eval": 1}))
    from tinyrl.tasks.gsm8k import is_held_out

    assert len(train) == sum(not is_held_out(r["question"]) for r in ROWS[:40])  # the rest is held out
    assert all(r["gold"].isdigit() for r in train)


@pytest.mark.parametrize("content,words", [
    ("missing", "data file not found"),
    ('{"question": "q"}\n', "lacks ['answer']"),
    ('{"question": "q", "answer": "42"}\n', "no '#### <number>' line"),
])
def test_bad_data_is_a_config_error_naming_the_problem(tmp_path, content, words):
    path = None
    if content == "missing":
        path = tmp_path / "nope.jsonl"
    elif content is not None:
        path = tmp_path / "train.jsonl"
        path.write_text(content)
    over = {"data.task": "gsm8k", "data.task_args": {"path": None if path is None else str(path)}}
    with pytest.raises(ConfigError, match=r"data \(task 'gsm8k'\)") as e:
        load_rows(load_config(None, over)[1].data)
    assert words in str(e.value)
