"""Question-answering verifiers: Search-R1 exact match and F1, Search-R1's format check, GAIA's scorer.

The answer is read from the **completion only** (never the prompt, whose instruction carries an
example `<answer> Beijing </answer>`): the last `<answer>...</answer>` of the response, after the
tool observations spliced into it (`<information>...</information>`, `<tool_response>...`) are
cut out, so a retrieved document cannot supply the answer tags. No answer scores 0.

- `qa_em`: Search-R1's exact match: SQuAD normalisation (lower case, punctuation and articles
  a/an/the removed, whitespace collapsed), 1.0 when it equals any of the row's `golden_answers`.
- `qa_f1`: SQuAD token F1 against the best golden answer.
- `search_r1_format`: Search-R1's `is_valid_sequence` state machine: tags balanced and in order
  (`<think>` before each action by default; `think=False` for models that skip it), only
  whitespace between blocks, ending in the answer.
- `gaia`: GAIA's official `question_scorer` (the leaderboard's scorer.py): a numeric ground truth
  compares as a float after `$`, `%` and `,` are stripped from the answer; a ground truth with `,`
  or `;` is a list compared element by element in order (numbers as numbers, strings with
  whitespace removed and lower-cased); any other string compares with whitespace and punctuation
  removed, lower-cased. The answer is `<answer>...</answer>`, else a `FINAL ANSWER:` line.

Rows carry `golden_answers` (a list, or one string); GAIA rows (`tinyrl.agents.data.load_gaia`)
also carry it, from the set's `Final answer`.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from typing import Any

from tinyrl.rewards.guards import completion_text

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OBSERVATION = re.compile(r"<information>.*?(?:</information>|$)|<tool_response>.*?(?:</tool_response>|$)", re.DOTALL)
_FINAL_ANSWER = re.compile(r"FINAL ANSWER:\s*(.+)", re.IGNORECASE)


# --------------------------------------------------------------------------- answers


def strip_observations(text: str) -> str:
    """The completion without the tool observations spliced into it.

    >>> strip_observations("<search> x </search><information>Doc 1 <answer>y</answer></information> ok")
    '<search> x </search> ok'
    """
    return _OBSERVATION.sub("", text)


def extract_answer(completion: Any) -> str | None:
    """The last `<answer>...</answer>` of the response (observations removed), stripped; None if none.

    >>> extract_answer("<search> q </search>\\n<information>...</information>\\n<answer> Kelmora </answer>")
    'Kelmora'
    >>> extract_answer("<answer>a</answer> then <answer>b</answer>"), extract_answer("just text")
    ('b', None)
    """
    found = _ANSWER.findall(strip_observations(completion_text(completion)))
    return found[-1].strip() if found else None


def normalize_answer(s: str) -> str:
    """SQuAD / Search-R1 normalisation: lower, drop punctuation and articles, collapse whitespace.

    >>> normalize_answer("  The  Eiffel-Tower! "), normalize_answer("an Apple, a day")
    ('eiffeltower', 'apple day')
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _golds(golden_answers: Any) -> list[str]:
    if golden_answers is None:
        return []
    if isinstance(golden_answers, str):
        return [golden_answers]
    if isinstance(golden_answers, dict):  # Search-R1 parquet: {"target": [...]}
        return _golds(golden_answers.get("target"))
    return [str(g) for g in golden_answers]


def em_check(prediction: str | None, golden_answers: Any) -> bool:
    """Exact match after normalisation against any golden answer.

    >>> em_check("the Kelmora.", ["Kelmora"]), em_check("Kelmora City", "Kelmora"), em_check(None, ["x"])
    (True, False, False)
    """
    if prediction is None:
        return False
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(g) for g in _golds(golden_answers))


def f1_score(prediction: str | None, golden_answers: Any) -> float:
    """SQuAD token F1 (after normalisation), the best over the golden answers.

    >>> round(f1_score("Brenna Tillen Quist", ["Brenna Tillen"]), 3), f1_score("x", ["y"]), f1_score(None, ["y"])
    (0.8, 0.0, 0.0)
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for g in _golds(golden_answers):
        gold = normalize_answer(g).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common == 0:
            continue
        p, r = common / len(pred), common / len(gold)
        best = max(best, 2 * p * r / (p + r))
    return best


def _column(columns: dict, n: int, *names: str) -> list:
    for name in names:
        if name in columns and columns[name] is not None:
            return list(columns[name])
    raise KeyError(f"the rows need a {names[0]!r} column (got columns {sorted(columns)})")


def qa_em_reward(prompts: list, completions: list, **columns) -> list[float]:
    """1.0 when the response's last `<answer>` matches a golden answer (Search-R1 EM).

    >>> qa_em_reward(None, ["<answer> Kelmora </answer>", "<answer>Ostrel</answer>", "Kelmora"],
    ...              golden_answers=[["Kelmora"]] * 3)
    [1.0, 0.0, 0.0]
    """
    golds = _column(columns, len(completions), "golden_answers", "answer")
    return [float(em_check(extract_answer(c), g)) for c, g in zip(completions, golds)]


def qa_f1_reward(prompts: list, completions: list, **columns) -> list[float]:
    """SQuAD token F1 of the response's last `<answer>` against the golden answers."""
    golds = _column(columns, len(completions), "golden_answers", "answer")
    return [f1_score(extract_answer(c), g) for c, g in zip(completions, golds)]


# --------------------------------------------------------------------------- Search-R1's format check

_TAGS = ("think", "search", "information", "answer")
_SPLIT = re.compile(r"(</?(?:think|search|information|answer)>)")


def valid_search_r1_sequence(text: str, think: bool = True) -> tuple[bool, str]:
    """Search-R1's `is_valid_sequence` on a response: (ok, reason).

    `think=True` is Search-R1's rule (a `<think>` block before every search and the answer);
    `think=False` lets an action follow the start or an observation directly.

    >>> valid_search_r1_sequence("<think>a</think><search>q</search><information>d</information>"
    ...                          "<think>b</think><answer>x</answer>")
    (True, 'valid')
    >>> valid_search_r1_sequence("<search>q</search><information>d</information><answer>x</answer>")
    (False, 'unexpected <search> in state start')
    >>> valid_search_r1_sequence("<search>q</search><information>d</information><answer>x</answer>", think=False)
    (True, 'valid')
    """
    for tag in _TAGS:
        if text.count(f"<{tag}>") != text.count(f"</{tag}>"):
            return False, f"unbalanced <{tag}> tags"
    acting = ("after_think",) if think else ("start", "information", "after_think")
    moves = {
        ("<think>", "start"): "in_think", ("<think>", "information"): "in_think",
        ("</think>", "in_think"): "after_think",
        ("</search>", "in_search"): "after_search",
        ("<information>", "after_search"): "in_information",
        ("</information>", "in_information"): "information",
        ("</answer>", "in_answer"): "end",
    }
    state = "start"
    for part in _SPLIT.split(text):
        if not part.strip():
            continue
        if _SPLIT.fullmatch(part):
            if part in ("<search>", "<answer>") and state in acting:
                state = "in_search" if part == "<search>" else "in_answer"
            elif (part, state) in moves:
                state = moves[(part, state)]
            else:
                return False, f"unexpected {part} in state {state}"
        elif not state.startswith("in_"):
            return False, f"text outside the tags in state {state}"
    return (True, "valid") if state == "end" else (False, f"ends in state {state}")


def search_r1_format_reward(prompts: list, completions: list, think: bool = True, **columns) -> list[float]:
    """1.0 for a response that follows Search-R1's tag grammar (see `valid_search_r1_sequence`)."""
    return [float(valid_search_r1_sequence(completion_text(c), think)[0]) for c in completions]


# --------------------------------------------------------------------------- GAIA


def _is_float(x: Any) -> bool:
    try:
        float(x)
        return True
    except (TypeError, ValueError):
        return False


def _number(text: str) -> float:
    """A number with `$`, `%` and `,` removed; inf when it is not one (so it equals nothing)."""
    for ch in "$%,":
        text = text.replace(ch, "")
    try:
        return float(text)
    except ValueError:
        return math.inf


def _norm_str(text: str, remove_punct: bool = True) -> str:
    text = re.sub(r"\s", "", text).lower()
    return text.translate(str.maketrans("", "", string.punctuation)) if remove_punct else text


def gaia_question_scorer(model_answer: str | None, ground_truth: str) -> bool:
    """GAIA's official scorer (same decisions as the leaderboard's `question_scorer`).

    >>> gaia_question_scorer("$1,000", "1000"), gaia_question_scorer("17 km", "17")
    (True, False)
    >>> gaia_question_scorer("b, a", "a, b"), gaia_question_scorer("St. Petersburg", "saint petersburg")
    (False, False)
    """
    model_answer = "None" if model_answer is None else str(model_answer)
    ground_truth = str(ground_truth)
    if _is_float(ground_truth):
        return _number(model_answer) == float(ground_truth)
    if any(ch in ground_truth for ch in ",;"):
        gt, ma = re.split(r"[,;]", ground_truth), re.split(r"[,;]", model_answer)
        if len(gt) != len(ma):
            return False
        return all(_number(m) == float(g) if _is_float(g) else _norm_str(m, False) == _norm_str(g, False)
                   for m, g in zip(ma, gt))
    return _norm_str(model_answer) == _norm_str(ground_truth)


def extract_gaia_answer(completion: Any) -> str | None:
    """`<answer>...</answer>` (the last), else the text after the last `FINAL ANSWER:`; None if neither.

    >>> extract_gaia_answer("thinking...\\nFINAL ANSWER: 42"), extract_gaia_answer("no idea")
    ('42', None)
    """
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    found = _FINAL_ANSWER.findall(strip_observations(completion_text(completion)))
    return found[-1].strip() if found else None


def gaia_reward(prompts: list, completions: list, **columns) -> list[float]:
    """GAIA's scorer on the response's answer vs the row's `golden_answers` (its `Final answer`).

    A row without a ground truth (GAIA's test split shows `?`) scores None: excluded, not 0.

    >>> gaia_reward(None, ["<answer>$12.50</answer>", "FINAL ANSWER: b; a", "<answer>x</answer>"],
    ...             golden_answers=[["12.5"], ["a; b"], ["?"]])
    [1.0, 0.0, None]
    """
    golds = _column(columns, len(completions), "golden_answers", "final_answer")
    out: list[float | None] = []
    for c, g in zip(completions, golds):
        truth = _golds(g)
        if not truth or truth[0].strip() in ("", "?"):
            out.append(None)
            continue
        out.append(float(gaia_question_scorer(extract_gaia_answer(c), truth[0])))
    return out
