"""Math answers: pull the final answer out of a completion, check it with math-verify.

Extraction (`extract_answer`), in order of precedence:

1. `<answer>...</answer>` (a `\\boxed{}` inside it wins),
2. `\\boxed{...}` / `\\fbox{...}` with brace matching (nested braces are fine),
3. GSM8K's `#### 42`,
4. "The (final) answer is 42",
5. lenient mode only: the last number in the text.

Strict scoring (`math_strict`) needs one of 1-4; lenient (`math_lenient`) also takes 5.
Log both side by side (give `math_lenient` weight 0.0): early RL gains are often format
only, which shows as strict rising to meet lenient while lenient stays flat.

Guards, in both modes: text copied from the prompt is cut before extraction (the answer
cannot come from echoing the question); two different final answers of the winning form
(`\\boxed{3} ... \\boxed{4}`), or a hedge inside one ("3 or 4"), score 0.

Equivalence (`1/2` = `0.5` = `\\frac{1}{2}`, `x+1` = `1+x`) goes through math-verify with
its own signal-based timeouts off, in a worker pool (`tinyrl.rewards.pool`) that kills a
call after `timeout` seconds; a timed-out or failed check scores None (excluded).
Needs `pip install 'tinyrl-rlvr[math]'`.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from tinyrl.errors import MissingExtra
from tinyrl.rewards.guards import (
    answer_blocks,
    completion_text,
    distinct_answers,
    is_hedged,
    normalize_answer,
    strip_prompt_echo,
)
from tinyrl.rewards.pool import TIMEOUT, CallError, shared_pool

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"\b(?:final answer|the answer)\s*(?:is|:|=)\s*:?\s*([^\n]+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_LEAD_NUM = re.compile(r"^\$?\s*(" + _NUMBER.pattern + r")\s*\$?(?:\s|\.|,|$)")


def find_boxed(text: str) -> list[str]:
    """The contents of every `\\boxed{...}` in `text`, braces matched; unclosed ones skipped.

    >>> find_boxed(r"so \\boxed{\\frac{1}{2}} and \\boxed{3")
    ['\\\\frac{1}{2}']
    """
    out = []
    for m in _BOX.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0 and text[m.end(): i - 1].strip():
            out.append(text[m.end(): i - 1].strip())
    return out


def _clean(ans: str) -> str:
    ans = ans.strip()
    if len(ans) >= 2 and ans[0] == ans[-1] == "$":
        ans = ans.strip("$").strip()
    return ans.rstrip(".").strip()


def find_gsm8k(text: str) -> list[str]:
    """Answers after GSM8K's `####` marker (the number; commas and units dropped).

    >>> find_gsm8k("She pays 3 * 4 = 12 dollars.\\n#### 1,200 dollars")
    ['1200']
    """
    out = []
    for m in _GSM8K.finditer(text):
        tail = m.group(1).strip()
        num = _LEAD_NUM.match(tail)
        out.append(num.group(1).replace(",", "") if num else _clean(tail))
    return [a for a in out if a]


def find_answer_is(text: str) -> list[str]:
    """Answers stated as "The answer is ..." / "Final answer: ..." (to the end of the sentence).

    >>> find_answer_is("So the final answer is $\\\\frac{3}{4}$. Done.")
    ['\\\\frac{3}{4}']
    """
    out = []
    for m in _ANSWER_IS.finditer(text):
        tail = m.group(1).strip()
        sentence = _clean(re.split(r"\.\s|\.$", tail)[0])
        num = _LEAD_NUM.match(tail)
        if is_hedged(sentence):
            out.append(sentence)  # "3 or 4": kept whole so the hedge guard sees it
        elif num:
            out.append(num.group(1).replace(",", ""))
        elif tail.startswith("$") and "$" in tail[1:]:
            out.append(tail[1: tail.index("$", 1)].strip())
        else:
            out.append(sentence)
    return [a for a in out if a]


def last_number(text: str) -> str | None:
    """The last number in `text` (lenient fallback): integers, decimals, fractions, 1,000s.

    >>> last_number("3 apples, then 12.5, and finally 1,024 of them.")
    '1024'
    """
    nums = _NUMBER.findall(text)
    return nums[-1].replace(",", "") if nums else None


def extract_answer(text: str, mode: str = "strict", prompt: Any = None) -> str | None:
    """The one final answer of a completion, or None (missing, several, hedged).

    >>> extract_answer("2+2 is... \\\\boxed{4}")
    '4'
    >>> extract_answer("\\\\boxed{3} or maybe \\\\boxed{4}") is None
    True
    >>> extract_answer("I get 4 in the end", mode="lenient")
    '4'
    """
    if mode not in ("strict", "lenient"):
        raise ValueError(f"mode must be 'strict' or 'lenient', got {mode!r}")
    text = completion_text(text)
    if prompt is not None:
        text = strip_prompt_echo(text, prompt)
    tagged = []
    for t in answer_blocks(text):
        tagged += find_boxed(t) or [_clean(t)]
    for found in (tagged, find_boxed(text), find_gsm8k(text), find_answer_is(text)):
        found = [a for a in found if a]
        if found:
            options = distinct_answers(found)
            if len(options) > 1 or is_hedged(options[0]):
                return None
            return options[0]
    if mode == "lenient":
        return last_number(text)
    return None


def gold_answer(answer: Any) -> str:
    """The reference answer of a row: a plain answer, a GSM8K solution (`#### n`), or a boxed one."""
    a = str(answer).strip()
    for found in (find_gsm8k(a), find_boxed(a)):
        if found:
            return found[-1]
    return _clean(a)


def _require_math_verify() -> None:
    if importlib.util.find_spec("math_verify") is None:
        raise MissingExtra("math rewards need math-verify: pip install 'tinyrl-rlvr[math]'")


def answers_equivalent(pairs: list[tuple[str, str]], timeout: float = 5.0) -> list[bool | None]:
    """math-verify equivalence of each (gold, predicted) pair; None where it failed or timed out.

    Identical normalised strings short-cut to True without a worker call.

    >>> answers_equivalent([("\\\\frac{1}{2}", "0.5"), ("3", "4")])
    [True, False]
    """
    out: list[bool | None] = [None] * len(pairs)
    todo = []
    for k, (g, p) in enumerate(pairs):
        if normalize_answer(g) == normalize_answer(p):
            out[k] = True
        else:
            todo.append(k)
    if todo:
        _require_math_verify()
        pool = shared_pool("math", warm="warm_math")
        res = pool.map("math_equiv", [pairs[k] for k in todo], timeout=timeout)
        for k, r in zip(todo, res):
            out[k] = None if (r is TIMEOUT or isinstance(r, CallError)) else bool(r)
    return out


def math_scores(prompts: list | None, completions: list, answer: list, timeout: float = 5.0,
                echo_guard: bool = True) -> dict[str, list[float | None]]:
    """Strict and lenient scores of the same completions, side by side: {"strict": [...], "lenient": [...]}.

    `echo_guard=False` keeps text copied from the prompt (e.g. multiple choice, where a
    right answer may repeat a long option line verbatim).
    """
    prompts = prompts if prompts is not None and echo_guard else [None] * len(completions)
    golds = [gold_answer(a) for a in answer]
    preds = {m: [extract_answer(c, m, p) for c, p in zip(completions, prompts)] for m in ("strict", "lenient")}
    pairs = sorted({(g, p) for m in preds for g, p in zip(golds, preds[m]) if p is not None})
    verdict = dict(zip(pairs, answers_equivalent(pairs, timeout=timeout)))
    out = {}
    for m, ps in preds.items():
        scores = []
        for g, p in zip(golds, ps):
            v = verdict.get((g, p), False) if p is not None else False
            scores.append(None if v is None else float(v))
        out[m] = scores
    return out


def _gold_column(answer, columns: dict) -> list:
    gold = answer if answer is not None else columns.get("solution")  # TRL's datasets call it "solution"
    if gold is None:
        raise ValueError("math rewards need an 'answer' (or 'solution') column with the reference answers")
    return gold


def math_strict_reward(prompts: list, completions: list, answer: list | None = None, timeout: float = 5.0,
                       echo_guard: bool = True, **columns) -> list[float | None]:
    """1.0 when the completion's one final answer (boxed, <answer>, ####, "the answer is") equals `answer`.

    >>> math_strict_reward(["Half of 1?"], ["Half is \\\\boxed{0.5}"], answer=["\\\\frac{1}{2}"])
    [1.0]
    >>> math_strict_reward(["Half of 1?"], ["I think 0.5"], answer=["1/2"])
    [0.0]
    """
    return math_scores(prompts, completions, _gold_column(answer, columns), timeout, echo_guard)["strict"]


def math_lenient_reward(prompts: list, completions: list, answer: list | None = None, timeout: float = 5.0,
                        echo_guard: bool = True, **columns) -> list[float | None]:
    """Like `math_strict`, but a completion with no marked answer is read by its last number.

    >>> math_lenient_reward(["Half of 1?"], ["I think 0.5"], answer=["1/2"])
    [1.0]
    """
    return math_scores(prompts, completions, _gold_column(answer, columns), timeout, echo_guard)["lenient"]
