"""Format rewards: think/answer structure, exactly one final answer, DAPO's overlong shaping
against TRL's, and the ways of combining components."""

import pytest
import torch

from tinyrl.algo.shaping import overlong_penalty
from tinyrl.config import RewardSpec
from tinyrl.rewards.core import RewardSet
from tinyrl.rewards.format import answer_format_reward, one_answer_reward, think_answer_format_reward


@pytest.mark.parametrize("completion, ok", [
    ("<think>\n3 * 4 = 12\n</think>\n<answer>12</answer>", True),
    ("  <think>a</think><answer>b</answer>\n", True),
    ("<think>a</think>\n<answer>b</answer> trailing words", False),  # nothing after the answer
    ("<think>a</think>", False),  # no answer
    ("<answer>b</answer>", False),  # no think
    ("<think>a</think><answer>b</answer><answer>c</answer>", False),  # two answers
    ("<think>a<think>b</think></think><answer>c</answer>", False),  # nested think
    ("<think></think><answer>c</answer>", False),  # empty reasoning
    ("<think>a</think><answer> </answer>", False),  # empty answer
    ("<answer>b</answer><think>a</think>", False),  # wrong order
    ("", False),
])
def test_think_answer_format(completion, ok):
    assert think_answer_format_reward(["Q"], [completion]) == [float(ok)]


def test_think_block_opened_by_the_prompt():
    prompt = "<|im_start|>assistant\n<think>"
    assert think_answer_format_reward([prompt], ["reasoning</think><answer>4</answer>"]) == [1.0]
    assert think_answer_format_reward(["Q"], ["reasoning</think><answer>4</answer>"]) == [0.0]


def test_answer_format_and_chat_completions():
    chat = [[{"role": "assistant", "content": "so <answer>4</answer>"}]]
    assert answer_format_reward(["Q"], chat) == [1.0]
    assert answer_format_reward(["Q"] * 3, ["<answer>4</answer><answer>4</answer>", "4", "<answer>4"]) == [0.0] * 3


def test_one_answer():
    completions = [r"so \boxed{4}", r"\boxed{4} and again \boxed{4}", r"\boxed{4} or \boxed{5}",
                   "<answer>3 or 4</answer>", "no answer at all", "#### 7"]
    assert one_answer_reward(["Q"] * 6, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_overlong_shaping_agrees_with_trl():
    """The one overlong mechanism (algo.overlong_buffer) gives TRL's soft overlong punishment."""
    trl_rewards = pytest.importorskip("trl.rewards")
    trl_fn = trl_rewards.get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    lengths = list(range(0, 130, 7))
    ours = overlong_penalty(torch.tensor(lengths), max_len=100, buffer=20).tolist()
    assert ours == pytest.approx(trl_fn(completion_ids=[[1] * n for n in lengths]))


def length_penalty(prompts, completions, completion_ids, **kw):
    return [-len(ids) / 10 for ids in completion_ids]


def test_components_weighted_and_logged_through_reward_set():
    rs = RewardSet([RewardSpec("math_strict", 1.0), RewardSpec("think_answer_format", 0.2),
                    RewardSpec(f"{__name__}:length_penalty", 0.5)], combine="sum")
    completions = ["<think>2+2</think><answer>4</answer>", r"\boxed{4}", "<think>x</think><answer>5</answer>"]
    ids = [[1] * 3, [1] * 8, [1] * 12]
    total, comps, report = rs.score(["2+2?"] * 3, completions, [{"answer": "4"}] * 3, completion_ids=ids)
    assert comps["math_strict"].tolist() == [1.0, 1.0, 0.0]
    assert comps["think_answer_format"].tolist() == [1.0, 0.0, 1.0]
    assert comps["length_penalty"].tolist() == pytest.approx([-0.3, -0.8, -1.2])
    assert total.tolist() == pytest.approx([1.05, 0.6, -0.4])
    assert report.failures == {}

    rs.combine = "normalize_then_sum"  # each component standardised over the batch before weighting
    total, comps, _ = rs.score(["2+2?"] * 3, completions, [{"answer": "4"}] * 3, completion_ids=ids)
    z = lambda v: (v - v.mean()) / (v.std() + 1e-6)  # noqa: E731
    expect = z(comps["math_strict"]) + 0.2 * z(comps["think_answer_format"]) + 0.5 * z(comps["length_penalty"])
    assert torch.allclose(total, expect, atol=1e-5)
