"""The rewards API: TRL signature, weights, per-component values, failures counted not raised."""

import math

import pytest
import torch

from tinyrl.config import RewardSpec
from tinyrl.rewards.core import RewardImportError, RewardSet, resolve_reward


def exact(prompts, completions, answer, **kw):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def length_bonus(prompts, completions, **kw):
    return [len(c) / 10 for c in completions]


def boom(prompts, completions, **kw):
    raise RuntimeError("verifier crashed")


def sometimes_none(prompts, completions, **kw):
    return [None if c == "x" else 1.0 for c in completions]


def score(specs, completions=("4", "5", "x"), answers=("4", "4", "4")):
    rs = RewardSet([RewardSpec(f"{__name__}:{n}", w) for n, w in specs])
    cols = [{"answer": a} for a in answers]
    return rs, rs.score(["2+2="] * len(completions), list(completions), cols)


def test_weighted_sum_and_components():
    _, (total, comps, report) = score([("exact", 1.0), ("length_bonus", 0.5)])
    assert torch.allclose(comps["exact"], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(total, torch.tensor([1.05, 0.05, 0.05]))
    assert report.failures == {} and report.excluded == 0


def test_raising_reward_is_counted_and_excluded_not_raised():
    rs, (total, comps, report) = score([("exact", 1.0), ("boom", 1.0)])
    assert report.failures == {"boom": 3} and "verifier crashed" in report.errors["boom"]
    assert torch.isnan(total).all() and report.excluded == 3
    assert rs.total_failures["boom"] == 3


def test_none_excludes_only_that_sample():
    _, (total, _, report) = score([("sometimes_none", 1.0)])
    assert total[:2].tolist() == [1.0, 1.0] and math.isnan(total[2])
    assert report.failures == {"sometimes_none": 1}


def test_wrong_length_is_a_failure():
    def short(prompts, completions, **kw):
        return [1.0]

    rs = RewardSet([])
    rs.components = [("short", short, 1.0)]
    total, _, report = rs.score(["p", "p"], ["a", "b"], [{}, {}])
    assert report.failures == {"short": 2} and torch.isnan(total).all()


def test_normalize_then_sum():
    rs = RewardSet([RewardSpec(f"{__name__}:length_bonus", 1.0)], combine="normalize_then_sum")
    total, _, _ = rs.score(["p"] * 3, ["a", "aa", "aaa"], [{}] * 3)
    assert torch.allclose(total, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-4)


def test_resolve_errors_are_clear():
    with pytest.raises(RewardImportError, match="cannot import 'no.such.module:f'"):
        resolve_reward("no.such.module:f")
    with pytest.raises(RewardImportError, match="unknown reward 'nope'"):
        resolve_reward("nope")


def test_sum_then_normalize():
    rs = RewardSet([RewardSpec(f"{__name__}:length_bonus", 1.0), RewardSpec(f"{__name__}:length_bonus", 1.0)],
                   combine="sum_then_normalize")
    total, comps, _ = rs.score(["p"] * 3, ["a", "aa", "aaa"], [{}] * 3)
    assert set(comps) == {"length_bonus", "length_bonus_2"}
    assert torch.allclose(total, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-4)
