"""Format rewards: the shape of a completion, not its correctness.

- `think_answer_format`: `<think>...</think>` then `<answer>...</answer>`, each exactly once,
  nothing after the answer. A prompt ending in `<think>` (chat templates that open the
  think block) counts as the completion's opening tag.
- `answer_format`: exactly one non-empty `<answer>...</answer>`, at the end.
- `one_answer`: exactly one final answer (one distinct `<answer>` / `\\boxed{}` / `####` /
  "the answer is"), no hedging; the guard of `tinyrl.rewards.math` as its own signal.
- `code_block` (by path, `tinyrl.rewards.format:code_block_reward`): a non-empty fenced Python
  block, the code reward's format alone (benchmarks/code_rl.py's ablation: RL on it cannot raise
  pass rates). A prompt ending in an opening fence counts as the completion's.

DAPO's soft overlong punishment is not a reward here but a run switch (`algo.overlong_buffer`,
`tinyrl.algo.shaping`), so its length limit is always the run's `rollout.max_new_tokens`.

Format rewards are cheap to game; weight them below the correctness reward and watch
`math_strict` against `math_lenient` to see whether gains are format only.
"""

from __future__ import annotations

import re

from tinyrl.rewards.guards import answer_blocks, completion_text, prompt_text
from tinyrl.rewards.math import extract_answer

_THINK_ANSWER = re.compile(r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL)
_TAG = re.compile(r"</?(?:think|answer)>")


def _prefilled(prompt) -> bool:
    return prompt_text(prompt).rstrip().endswith("<think>")


def think_answer_ok(completion: str, prompt=None) -> bool:
    """Whether `completion` is exactly `<think>...</think><answer>...</answer>` (tags once each)."""
    text = completion_text(completion)
    if prompt is not None and _prefilled(prompt) and not text.lstrip().startswith("<think>"):
        text = "<think>" + text
    m = _THINK_ANSWER.match(text)
    if not m or not m.group("think").strip() or not m.group("answer").strip():
        return False
    return len(_TAG.findall(text)) == 4  # no stray or nested tags inside


def think_answer_format_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """1.0 for `<think>reasoning</think><answer>result</answer>`, each tag exactly once.

    >>> think_answer_format_reward(["Q"] * 3, [
    ...     "<think>2+2 is 4</think>\\n<answer>4</answer>",
    ...     "<think>2+2 is 4</think><answer>4</answer><answer>5</answer>",
    ...     "<answer>4</answer>"])
    [1.0, 0.0, 0.0]
    """
    prompts = prompts if prompts is not None else [None] * len(completions)
    return [float(think_answer_ok(c, p)) for c, p in zip(completions, prompts)]


def answer_format_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """1.0 when the completion ends with its one non-empty `<answer>...</answer>`.

    >>> answer_format_reward(["Q"] * 3, ["so <answer>4</answer>", "<answer>4</answer> and more", "<answer> </answer>"])
    [1.0, 0.0, 0.0]
    """
    out = []
    for c in completions:
        text = completion_text(c)
        blocks = answer_blocks(text)
        ok = (len(blocks) == 1 and text.lower().count("<answer>") == 1 and blocks[0].strip() != ""
              and text.rstrip().endswith("</answer>"))
        out.append(float(ok))
    return out


def one_answer_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """1.0 when the completion gives exactly one final answer (no second or hedged one).

    >>> one_answer_reward(["Q"] * 3, ["\\\\boxed{4}", "\\\\boxed{4} or \\\\boxed{5}", "I think 4"])
    [1.0, 0.0, 0.0]
    """
    prompts = prompts if prompts is not None else [None] * len(completions)
    return [float(extract_answer(c, "strict", p) is not None) for c, p in zip(completions, prompts)]


def code_block_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """1.0 when the completion has a non-empty fenced code block (what `code_tests` would run), else 0.0.

    >>> code_block_reward(["Q", "Q", "Q\\n```python\\n"], ["```python\\nx = 1\\n```", "x = 1", "x = 1\\n```"])
    [1.0, 0.0, 1.0]
    """
    from tinyrl.rewards.code import extract_code

    prompts = prompts if prompts is not None else [None] * len(completions)
    out = []
    for p, c in zip(prompts, completions):
        text = completion_text(c)
        opened = re.search(r"```[ \t]*(python3?|py)?[ \t]*\n\Z", prompt_text(p) if p is not None else "")
        code = extract_code((opened.group(0) if opened else "") + text)
        out.append(float(bool(code and code.strip())))
    return out
