"""Math answers: every extractor on real-looking output, math-verify equivalence, guards, timeouts."""

import math
import time

import pytest
import torch

from tinyrl.config import RewardSpec
from tinyrl.rewards.core import RewardSet
from tinyrl.rewards.guards import completion_text, is_hedged, strip_prompt_echo
from tinyrl.rewards.math import (
    answers_equivalent,
    extract_answer,
    find_answer_is,
    find_boxed,
    find_gsm8k,
    gold_answer,
    last_number,
    math_lenient_reward,
    math_scores,
    math_strict_reward,
)
from tinyrl.rewards.pool import TIMEOUT, CallError, TimeoutPool

pytest.importorskip("math_verify")


# --- extractors -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (r"The area is $\boxed{\frac{\sqrt{3}}{4}}$.", [r"\frac{\sqrt{3}}{4}"]),
    (r"\boxed{\left\{ 1, 2 \right\}}", [r"\left\{ 1, 2 \right\}"]),
    (r"first \boxed{3} then \fbox{4}", ["3", "4"]),
    (r"\boxed {x^{2}+1}", ["x^{2}+1"]),
    (r"unclosed \boxed{\frac{1}{2}", []),
    (r"empty \boxed{} here", []),
    ("no box at all", []),
])
def test_find_boxed_matches_braces(text, expected):
    assert find_boxed(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("Natalia sold 48/2 = 24 clips in May.\nAltogether she sold 48+24 = 72 clips.\n#### 72", ["72"]),
    ("#### 1,234", ["1234"]),
    ("#### -3.5 dollars", ["-3.5"]),
    ("####  $18", ["18"]),
    ("no marker 42", []),
])
def test_find_gsm8k(text, expected):
    assert find_gsm8k(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("So the answer is 42.", ["42"]),
    ("The final answer is $\\frac{1}{2}$. I hope it is correct.", ["\\frac{1}{2}"]),
    ("Final answer: 1,000", ["1000"]),
    ("the answer is x = 3.", ["x = 3"]),
    ("I have no idea", []),
])
def test_find_answer_is(text, expected):
    assert find_answer_is(text) == expected


def test_last_number_fallback():
    assert last_number("First 3, then 4.5, finally -7/2") == "-7/2"
    assert last_number("There are 1,024 bits") == "1024"
    assert last_number("none here") is None


def test_extract_answer_precedence_and_modes():
    # <answer> beats a \boxed used in the reasoning; \boxed inside <answer> is unwrapped
    assert extract_answer(r"<think>try \boxed{5}</think><answer>\boxed{6}</answer>") == "6"
    assert extract_answer("<think>..</think><answer> 7 </answer>") == "7"
    assert extract_answer(r"work... \boxed{8}. #### 9") == "8"  # boxed beats ####
    assert extract_answer("blah\n#### 10") == "10"
    assert extract_answer("Thus the answer is 11.") == "11"
    assert extract_answer("I computed 12 in the end") is None  # strict needs a marked answer
    assert extract_answer("I computed 12 in the end", mode="lenient") == "12"
    with pytest.raises(ValueError):
        extract_answer("x", mode="fuzzy")


@pytest.mark.parametrize("text", [
    r"\boxed{3} or maybe \boxed{4}",  # two different final answers
    "<answer>3</answer> <answer>4</answer>",
    r"\boxed{3 \text{ or } 4}",  # a hedge inside one answer
    "The answer is 3 or 4.",
    "#### 3\n#### 5",
])
def test_multiple_or_hedged_answers_extract_nothing(text):
    assert extract_answer(text) is None
    assert extract_answer(text, mode="lenient") is None  # the guard holds in lenient mode too


def test_same_answer_twice_is_one_answer():
    assert extract_answer(r"\boxed{1,000} ... so \boxed{1000}") == "1,000"


def test_hedge_allowed_when_gold_has_it():
    assert is_hedged("\\pm 2") and not is_hedged("\\pm 2", gold="\\pm 2")


@pytest.mark.parametrize("text", ["", "}}}{{{", r"\boxed{", "<answer>", "####", "\x00\x01", "9" * 5000])
def test_malformed_output_does_not_crash(text):
    assert extract_answer(text) in (None, "9" * 5000)
    extract_answer(text, mode="lenient")


def test_chat_form_completions_are_read():
    assert completion_text([{"role": "assistant", "content": r"\boxed{2}"}]) == r"\boxed{2}"
    assert extract_answer([{"role": "assistant", "content": r"\boxed{2}"}]) == "2"


def test_gold_answer_forms():
    assert gold_answer("Janet has 3 ducks... 16 - 3 - 4 = 9\n#### 18") == "18"
    assert gold_answer(r"so $\boxed{\frac{1}{2}}$") == r"\frac{1}{2}"
    assert gold_answer(" 0.5 ") == "0.5"


# --- echo guard -------------------------------------------------------------------------------

PROMPT = ("Example: Tom has 2 apples and buys 3 more. The answer is 5.\n"
          "Question: Ann has 4 pears and eats one. How many are left?")


def test_answer_from_echoed_prompt_does_not_count():
    echo = PROMPT  # the model just repeats the prompt, whose worked example says "The answer is 5"
    assert extract_answer(echo) == "5"  # without the prompt to compare, the echo would read as an answer
    assert extract_answer(echo, prompt=PROMPT) is None
    assert extract_answer(echo, mode="lenient", prompt=PROMPT) is None
    assert math_strict_reward([PROMPT], [echo], answer=["5"]) == [0.0]
    assert math_lenient_reward([PROMPT], [echo], answer=["5"]) == [0.0]
    # a real answer after restating the question still counts
    assert extract_answer(PROMPT + "\nShe has 3 left. The answer is 3.", prompt=PROMPT) == "3"
    assert strip_prompt_echo("short", PROMPT) == "short"
    assert math_strict_reward([PROMPT], [echo], answer=["5"], echo_guard=False) == [1.0]  # the guard, off


# --- equivalence through math-verify ----------------------------------------------------------

EQUIVALENT = [("1/2", "0.5"), ("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "0.75"), ("x+1", "1+x"),
              ("\\{1,2\\}", "\\{2,1\\}"), ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"), ("1000", "1,000"),
              ("10\\%", "0.1"), ("72", "72.0"), ("2\\pi", "6.283185307")]
DIFFERENT = [("1/2", "0.25"), ("3", "4"), ("x+1", "x-1"), ("\\{1,2\\}", "\\{1,3\\}"), ("-4", "4")]


def test_equivalent_forms_match_and_wrong_answers_do_not():
    got = answers_equivalent(EQUIVALENT + DIFFERENT)
    assert got == [True] * len(EQUIVALENT) + [False] * len(DIFFERENT)


def test_strict_and_lenient_side_by_side():
    completions = [
        r"Half of it: $\boxed{0.5}$",  # right, formatted
        "I think it's 0.5",  # right, unformatted: lenient only
        r"\boxed{0.25}",  # wrong
        r"\boxed{0.5} or \boxed{0.25}",  # hedged
        "",  # empty
    ]
    scores = math_scores(["Half of 1?"] * 5, completions, ["\\frac{1}{2}"] * 5)
    assert scores == {"strict": [1.0, 0.0, 0.0, 0.0, 0.0], "lenient": [1.0, 1.0, 0.0, 0.0, 0.0]}


def test_through_reward_set_with_lenient_logged_at_weight_zero():
    rs = RewardSet([RewardSpec("math_strict", 1.0), RewardSpec("math_lenient", 0.0)])
    completions = [r"\boxed{72}", "so 72", r"\boxed{71}"]
    total, comps, report = rs.score(["Q"] * 3, completions, [{"answer": "She sold 72.\n#### 72"}] * 3)
    assert comps["math_strict"].tolist() == [1.0, 0.0, 0.0]
    assert comps["math_lenient"].tolist() == [1.0, 1.0, 0.0]
    assert total.tolist() == [1.0, 0.0, 0.0] and report.failures == {}


# --- timeouts ---------------------------------------------------------------------------------

def test_hanging_verifier_is_cut_off_and_the_run_goes_on():
    # sympy tries to evaluate 9^(9^(9^9)) and never returns: the pool kills that worker
    adversarial = r"\boxed{9^{9^{9^{9}}}}"
    rs = RewardSet([RewardSpec("math_strict", 1.0, {"timeout": 2.0})])
    t0 = time.monotonic()
    total, comps, report = rs.score(["Q"] * 3, [adversarial, r"\boxed{0.5}", r"\boxed{3}"], [{"answer": "1/2"}] * 3)
    assert time.monotonic() - t0 < 30
    assert math.isnan(comps["math_strict"][0]) and comps["math_strict"][1:].tolist() == [1.0, 0.0]
    assert math.isnan(total[0]) and total[1:].tolist() == [1.0, 0.0]  # excluded, not scored 0 or raised
    assert report.failures == {"math_strict": 1} and report.excluded == 1
    assert answers_equivalent([("1/2", "0.5")]) == [True]  # the pool still works afterwards


def test_timeout_pool_kills_hung_calls_and_reports_errors():
    pool = TimeoutPool(workers=2)
    try:
        t0 = time.monotonic()
        out = pool.map("time:sleep", [(0,), (60,), (0,)], timeout=1.0)
        assert out == [None, TIMEOUT, None] and time.monotonic() - t0 < 15
        assert pool.timeouts == 1
        err = pool.map("math:sqrt", [(-1,)], timeout=5.0)[0]
        assert isinstance(err, CallError) and "ValueError" in err.message
        died = pool.map("os:_exit", [(3,)], timeout=5.0)[0]  # the worker process dies mid-call
        assert isinstance(died, CallError) and "died" in died.message
        assert pool.map("operator:add", [(2, 3)], timeout=5.0) == [5]
    finally:
        pool.close()


def test_trl_style_solution_column_and_missing_column():
    assert math_strict_reward(["Q"], [r"\boxed{2}"], solution=["2"]) == [1.0]
    with pytest.raises(ValueError, match="answer"):
        math_strict_reward(["Q"], [r"\boxed{2}"])
    assert math_scores(None, [r"\boxed{2}"], ["2"])["strict"] == [1.0]


def test_reward_tensor_values_are_floats():
    total, comps, _ = RewardSet([RewardSpec("math_lenient")]).score(["Q"], ["12"], [{"answer": "12"}])
    assert comps["math_lenient"].dtype == torch.float32 and total.tolist() == [1.0]
