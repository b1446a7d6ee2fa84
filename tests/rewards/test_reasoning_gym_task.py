"""The built-in reasoning_gym task: offline rows, disjoint splits, graded by the dataset's own score_answer."""

import json

import pytest

pytest.importorskip("reasoning_gym")

from tinyrl.tasks import get_task  # noqa: E402
from tinyrl.tasks.reasoning_gym_task import extract_answer, score_reward  # noqa: E402


@pytest.fixture(scope="module")
def task():
    return get_task("reasoning_gym")


@pytest.fixture(scope="module")
def rows(task):
    return task.build(40, 20, seed=3, dataset="basic_arithmetic", min_terms=2, max_terms=3, max_digits=2)


def test_rows_are_deterministic_disjoint_and_serialisable(task, rows):
    train, held = rows
    assert len(train) == 40 and len(held) == 20
    assert not {r["question"] for r in train} & {r["question"] for r in held}
    assert len({r["question"] for r in train}) == 40
    assert task.build(40, 20, seed=3, dataset="basic_arithmetic", min_terms=2, max_terms=3, max_digits=2) == rows
    other, _ = task.build(40, 20, seed=4, dataset="basic_arithmetic", min_terms=2, max_terms=3, max_digits=2)
    assert [r["question"] for r in other] != [r["question"] for r in train]
    row = train[0]
    assert json.loads(json.dumps(row)) == row  # plain data: fits jsonl, samples.jsonl, a DataLoader
    assert row["prompt"].startswith(row["question"]) and "<answer></answer>" in row["prompt"]


def test_is_correct_uses_the_datasets_own_grader(task, rows):
    held = rows[1]
    for row in held[:5]:
        right = f"<think>compute</think>\n<answer>{row['answer']}</answer>"
        assert task.is_correct(right, row)
        assert not task.is_correct(f"<answer>{int(row['answer']) + 1}</answer>", row)
        assert not task.is_correct(row["answer"], row)  # no tags: no answer
        assert not task.is_correct(f"<answer>{row['answer']}</answer><answer>0</answer>", row)  # two answers
    assert task.reward([r["prompt"] for r in held[:2]], [f"<answer>{held[0]['answer']}</answer>", "nothing"],
                       **{k: [r[k] for r in held[:2]] for k in held[0]}) == [1.0, 0.0]


def test_echoed_instruction_and_partial_credit(task, rows):
    row = rows[1][0]
    echo = row["prompt"] + f"\n<answer>{row['answer']}</answer>"  # the prompt's empty tags are not an answer
    assert extract_answer(echo) == row["answer"] and task.is_correct(echo, row)
    # basic_arithmetic's score_answer gives partial credit when the answer is inside a longer string
    partial = score_reward([row["prompt"]], [f"<answer>{row['answer']} apples</answer>"],
                           **{k: [v] for k, v in row.items()})[0]
    assert 0.0 < partial < 1.0
    assert not task.is_correct(f"<answer>{row['answer']} apples</answer>", row)


def test_other_dataset_and_unknown_name(task):
    train, held = task.build(5, 5, seed=0, dataset="chain_sum")
    row = held[0]
    assert task.is_correct(f"<answer>{row['answer']}</answer>", row)
    with pytest.raises(ValueError, match="unknown dataset"):
        task.build(1, 1, dataset="no_such_dataset")


def test_flexible_extract_reads_an_untagged_final_answer_and_tags_mode_does_not(task):
    _, held = task.build(4, 4, seed=1, dataset="basic_arithmetic", extract="flexible", min_terms=2, max_terms=2,
                         max_digits=1, operators=["+"])
    r = held[0]
    wrong = str(int(r["answer"]) + 1)
    assert task.is_correct(f"I add them: {r['answer']}", r)  # the last number
    assert task.is_correct(f"<answer>{r['answer']}</answer> not {wrong}", r)  # a tag still wins
    assert not task.is_correct(f"{r['answer']}, no wait, {wrong}", r)
    assert not task.is_correct(r["question"], r)  # a copied question is not an answer
    assert not task.is_correct(f"I add them: {r['answer']}", {**r, "rg_extract": "tags"})
    with pytest.raises(ValueError, match="extract must be one of"):
        task.build(4, 4, extract="loose")
