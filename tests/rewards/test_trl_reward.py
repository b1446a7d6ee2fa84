"""TRL's own reward functions run through tinyrl's RewardSet."""

import pytest

from tinyrl.config import RewardSpec
from tinyrl.rewards.core import RewardSet
from tinyrl.rewards.trl_compat import as_chat

trl_rewards = pytest.importorskip("trl.rewards")
from trl.rewards import think_format_reward  # noqa: E402

COMPLETIONS = ["<think>\nreasoning\n</think>\nanswer", "<think>\nno end tag", "plain answer"]


def test_think_format_reward_through_reward_set_by_registry_name():
    rs = RewardSet([RewardSpec("trl", 1.0, {"fn": "think_format_reward"})])
    total, comps, report = rs.score(["Q"] * 3, COMPLETIONS, [{}] * 3)
    assert comps["trl"].tolist() == [1.0, 0.0, 0.0] and total.tolist() == [1.0, 0.0, 0.0]
    assert report.failures == {}


def test_trl_function_imported_directly_and_wrapped():
    assert as_chat(think_format_reward)(prompts=["Q"] * 3, completions=COMPLETIONS) == [1.0, 0.0, 0.0]
    # unwrapped, TRL's reward cannot read tinyrl's string completions: RewardSet counts it, does not crash
    rs = RewardSet([RewardSpec("trl.rewards:think_format_reward")])
    total, _, report = rs.score(["Q"] * 3, COMPLETIONS, [{}] * 3)
    assert report.failures == {"think_format_reward": 3} and report.excluded == 3


def test_trl_factory_reward_with_args():
    spec = RewardSpec("trl", 1.0, {"fn": "get_soft_overlong_punishment",
                                   "args": {"max_completion_len": 10, "soft_punish_cache": 5}})
    rs = RewardSet([spec])
    total, comps, _ = rs.score(["Q"] * 2, ["a", "b"], [{}] * 2, completion_ids=[[1] * 3, [1] * 8])
    assert comps["trl"].tolist() == pytest.approx([0.0, -0.6])


@pytest.mark.slow
def test_a_training_step_with_trl_rewards(tiny_model_dir, run_root):
    api = pytest.importorskip("tinyrl.api")
    overrides = {"model.name": tiny_model_dir, "log.run_dir": run_root, "log.progress": False,
                 "train.steps": 1, "train.prompts_per_step": 2, "rollout.num_generations": 4,
                 "train.micro_batch_size": 8, "rollout.max_new_tokens": 4, "data.num_train": 16,
                 "data.num_eval": 4, "train.eval_before_after": False,
                 "reward.functions": [
                     {"name": "trl", "kwargs": {"fn": "get_soft_overlong_punishment",
                                                "args": {"max_completion_len": 4, "soft_punish_cache": 3}}},
                     {"name": "trl", "weight": 0.5, "kwargs": {"fn": "think_format_reward"}},
                 ]}
    trainer = api.build_trainer(overrides=overrides)
    metrics, _ = trainer.train_step()
    assert metrics["reward_failures"] == 0
    assert -1.0 <= metrics["reward/trl"] <= 0.0  # the overlong punishment of the tiny model's short answers
    assert metrics["reward/trl_2"] == 0.0  # the arithmetic model never writes <think>
