"""Reward-hacking guards shared by the reward functions: plain text in, decisions out.

Early RL finds the cheapest way to a high reward. These helpers close the common ones:

- `completion_text`: TRL passes completions as strings or as chat messages; read both.
- `strip_prompt_echo`: remove text the completion copied from its prompt, so an answer
  cannot come from echoing the question (or a worked example inside it).
- `distinct_answers` / `is_hedged`: several different final answers, or one answer that
  hedges ("3 or 4"), score 0 instead of collecting credit for whichever one is right.
- `answer_blocks`: the one `<answer>...</answer>` extractor every reward and task uses.
"""

from __future__ import annotations

import re
from typing import Any

_HEDGE = re.compile(r"\bor\b|\beither\b|\\lor\b|\\vee\b|\\text\{\s*or\s*\}|\\pm\b|±", re.IGNORECASE)
_SPACE = re.compile(r"\s+")
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def answer_blocks(text: str) -> list[str]:
    """The contents of every closed `<answer>...</answer>` block, in order (tags in any case).

    >>> answer_blocks("x <answer> 4 </answer> then <ANSWER>5</ANSWER> and <answer>6")
    [' 4 ', '5']
    """
    return _ANSWER_BLOCK.findall(text)


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or TRL's chat form (a list of messages).

    >>> completion_text([{"role": "assistant", "content": "hi"}])
    'hi'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)):
        return "".join(completion_text(m) for m in completion
                       if not isinstance(m, dict) or m.get("role", "assistant") == "assistant")
    return "" if completion is None else str(completion)


def prompt_text(prompt: Any) -> str:
    """The text of a prompt: a string, or chat messages of any role joined by newlines."""
    if isinstance(prompt, (list, tuple)):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return "" if prompt is None else str(prompt)


def strip_prompt_echo(completion: str, prompt: Any, min_len: int = 20) -> str:
    """`completion` with every line of `prompt` that is `min_len`+ characters long cut out.

    Lines of the prompt shorter than `min_len` (numbers, "Answer:") are kept: a correct
    answer may well repeat them. The whole prompt is cut first.

    >>> p = "Q: what is 2+2? Example: the answer is 5"
    >>> strip_prompt_echo(p + " ... so 4", p)
    ' ... so 4'
    """
    prompt = prompt_text(prompt)
    if not prompt or not completion:
        return completion
    out = completion.replace(prompt.strip(), " ") if len(prompt.strip()) >= min_len else completion
    for line in sorted({ln.strip() for ln in prompt.splitlines()}, key=len, reverse=True):
        if len(line) >= min_len:
            out = out.replace(line, " ")
    return out if out != completion else completion


def normalize_answer(ans: str) -> str:
    """A loose canonical form for comparing extracted answers with each other (not for grading)."""
    a = ans.strip().strip("$").strip()
    a = re.sub(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}", r"\1", a)
    a = a.replace("\\!", "").replace("\\,", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    a = _SPACE.sub("", a).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", a):
        a = a.replace(",", "")
    return a


def distinct_answers(answers: list[str]) -> list[str]:
    """The different answers in `answers` (in order), comparing normalised forms.

    >>> distinct_answers(["1,000", "1000", " 1000 ", "7"])
    ['1,000', '7']
    """
    seen: dict[str, str] = {}
    for a in answers:
        seen.setdefault(normalize_answer(a), a)
    return list(seen.values())


def is_hedged(answer: str, gold: str = "") -> bool:
    """Whether an answer hedges between options ("3 or 4", "\\pm 2"), unless the gold does too.

    >>> is_hedged("3 or 4"), is_hedged("42"), is_hedged("x = \\\\pm 2", gold="\\\\pm 2")
    (True, False, False)
    """
    return bool(_HEDGE.search(answer)) and not _HEDGE.search(gold or "")
