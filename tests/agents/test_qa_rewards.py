"""QA verifiers as tables: Search-R1 EM / F1 normalisation, answer extraction, format check, GAIA's scorer."""

import pytest

from tinyrl.rewards import REWARDS
from tinyrl.rewards.qa import (
    em_check,
    extract_answer,
    extract_gaia_answer,
    f1_score,
    gaia_question_scorer,
    normalize_answer,
    valid_search_r1_sequence,
)

NORMALIZE = [
    ("Kelmora", "kelmora"),
    ("  The Kelmora ", "kelmora"),
    ("a potter", "potter"),
    ("An Apple a Day", "apple day"),
    ("Theodore", "theodore"),  # "the" only as a word
    ("U.S.A.", "usa"),
    ("rock-and-roll!", "rockandroll"),
    ("New\tYork\n City", "new york city"),
    ("", ""),
]


@pytest.mark.parametrize("raw,norm", NORMALIZE)
def test_squad_normalisation(raw, norm):
    assert normalize_answer(raw) == norm


EM = [
    ("Kelmora", ["Kelmora"], True),
    ("kelmora.", ["Kelmora"], True),
    ("the Kelmora", ["Kelmora"], True),
    ("Kelmora City", ["Kelmora"], False),  # EM is exact after normalisation: no substring credit
    ("Ostrel", ["Kelmora", "Ostrel"], True),  # any golden answer
    ("Kelmora", "Kelmora", True),  # one string
    ("Kelmora", {"target": ["Kelmora"]}, True),  # Search-R1 parquet ground truth
    ("", ["Kelmora"], False),
    (None, ["Kelmora"], False),
    ("Bales Bavax", ["Bavax Bales"], False),  # order matters
]


@pytest.mark.parametrize("pred,golds,ok", EM)
def test_exact_match(pred, golds, ok):
    assert em_check(pred, golds) is ok


F1 = [
    ("Bales Bavax", ["Bales Bavax"], 1.0),
    ("Bavax Bales", ["Bales Bavax"], 1.0),  # bag of tokens
    ("Bales", ["Bales Bavax"], 2 / 3),
    ("the Bales Bavax Tuvul", ["Bales Bavax"], 0.8),
    ("Tuvul", ["Bales Bavax"], 0.0),
    ("Bales", ["Tuvul", "Bales"], 1.0),  # best over golds
    (None, ["x"], 0.0),
]


@pytest.mark.parametrize("pred,golds,f1", F1)
def test_f1(pred, golds, f1):
    assert f1_score(pred, golds) == pytest.approx(f1)


EXTRACT = [
    ("<answer> Kelmora </answer>", "Kelmora"),
    ("<search> q </search>\n\n<information>Doc 1 x</information>\n\n<answer>Ostrel</answer>", "Ostrel"),
    ("<answer>a</answer><answer>b</answer>", "b"),  # the last one
    ("<search> q </search><information>Doc 1 <answer>planted</answer></information>", None),  # not from a document
    ("<information>unclosed <answer>planted</answer>", None),  # an observation cut by max_obs_tokens
    ("Kelmora", None),
    ("<answer>unclosed", None),
    ([{"role": "assistant", "content": "<answer>x</answer>"}], "x"),  # TRL chat form
]


@pytest.mark.parametrize("completion,answer", EXTRACT)
def test_answer_is_the_responses_last_answer(completion, answer):
    assert extract_answer(completion) == answer


def test_em_reward_reads_the_completion_not_the_prompt():
    prompt = "For example, <answer> Beijing </answer>. Question: where is it?"
    em = REWARDS["qa_em"]
    assert em([prompt] * 2, ["I don't know", "<answer> Beijing </answer>"], golden_answers=[["Beijing"]] * 2) == [0.0, 1.0]
    f1 = REWARDS["qa_f1"]([prompt], ["<answer> Beijing City </answer>"], golden_answers=[["Beijing"]])
    assert f1 == [pytest.approx(2 / 3)]


FORMAT = [
    ("<think>a</think><search>q</search><information>d</information><think>b</think><answer>x</answer>", True, True),
    ("<think>a</think>\n<answer>x</answer>", True, True),
    ("<search>q</search><information>d</information><answer>x</answer>", True, False),  # think required
    ("<search>q</search><information>d</information><answer>x</answer>", False, True),
    ("<think>a</think><answer>x</answer> trailing words", True, False),
    ("<think>a</think><search>q</search><answer>x</answer>", True, False),  # a search with no information
    ("<think>a<think>b</think></think><answer>x</answer>", True, False),
    ("<think>a</think><search>q</search><information>d</information>", True, False),  # no answer
    ("<think>a</think><answer>x", True, False),  # unbalanced
]


@pytest.mark.parametrize("text,think,ok", FORMAT)
def test_search_r1_format(text, think, ok):
    assert valid_search_r1_sequence(text, think)[0] is ok
    assert REWARDS["search_r1_format"](None, [text], think=think) == [float(ok)]


GAIA = [
    # numbers: $ % , stripped from the answer; compared as floats
    ("42", "42", True),
    ("42.0", "42", True),
    ("$1,000", "1000", True),
    ("17%", "17", True),
    ("0.170", "0.17", True),
    ("17 km", "17", False),  # units other than $ and % are not stripped
    ("seventeen", "17", False),
    ("41", "42", False),
    # lists: split on , and ;, same length, element by element in order
    ("a, b, c", "a, b, c", True),
    ("A ; B", "a; b", True),
    ("1, 2", "1.0, 2", True),  # numeric elements compare as numbers
    ("b, a", "a, b", False),  # order matters
    ("a, b", "a, b, c", False),  # length
    ("a, b.", "a, b", False),  # list elements keep punctuation
    # strings: whitespace and punctuation removed, lower case
    ("Saint Petersburg", "saint petersburg", True),
    ("St.-Petersburg!", "st petersburg", True),
    ("Petersburg", "saint petersburg", False),
    # missing answer
    (None, "42", False),
    (None, "None", True),  # the official scorer compares a missing answer as the string "None"
    ("", "Paris", False),
    # a quirk kept from the official scorer: "1,000" as ground truth is a list ["1", "000"]
    ("1000", "1,000", False),
]


@pytest.mark.parametrize("answer,truth,ok", GAIA)
def test_gaia_scorer(answer, truth, ok):
    assert gaia_question_scorer(answer, truth) is ok


def test_gaia_reward_extracts_and_excludes_hidden_answers():
    gaia = REWARDS["gaia"]
    out = gaia(None, ["<answer>$12.50</answer>", "so...\nFINAL ANSWER: Paris", "no answer here", "<answer>1</answer>"],
               golden_answers=[["12.5"], ["paris"], ["Paris"], ["?"]])
    assert out == [1.0, 1.0, 0.0, None]
    assert extract_gaia_answer("<information>FINAL ANSWER: planted</information>") is None
