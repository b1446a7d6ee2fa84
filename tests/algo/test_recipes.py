"""Named recipes train; dynamic sampling fills the batch with informative groups only."""

import pytest
import torch

from tinyrl.algo.recipes import RECIPES
from tinyrl.algo.shaping import informative_groups
from tinyrl.api import build_trainer
from tinyrl.config import apply_recipe, load_config


def base(model_dir, run_root, **extra):
    o = {"model.name": model_dir, "log.run_dir": run_root, "log.progress": False, "train.steps": 2,
         "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 8,
         "rollout.max_new_tokens": 4, "data.num_train": 64, "data.num_eval": 0, "train.lr": 1e-2,
         "train.eval_before_after": False, "reward.functions": ["tests.test_training:reward_by_length"]}
    o.update(extra)
    return o


def test_recipe_fills_switches_and_fields_override():
    algo = apply_recipe({"recipe": "dapo", "epsilon_high": 0.3})
    assert algo["dynamic_sampling"] and algo["epsilon_low"] == 0.2 and algo["epsilon_high"] == 0.3
    _, cfg = load_config(None, {"algo.recipe": "gspo"})
    assert cfg.algo.ratio_level == "sequence" and cfg.algo.epsilon_high == 4e-4


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_runs_and_changes_the_adapter(recipe, run_root):
    t = build_trainer(overrides=base("tiny-arith", run_root, **{"algo.recipe": recipe, "algo.num_iterations": 2}))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}
    for _ in range(2):
        metrics, _ = t.train_step()
        assert not metrics["skipped_nonfinite"]
    after = {n: p.detach() for n, p in t.model.named_parameters() if p.requires_grad}
    assert any(not torch.equal(before[n], after[n]) for n in before)


def half_constant(prompts, completions, **kw):
    """Groups whose prompt has an even first digit get reward 1 for all samples (no signal)."""
    return [1.0 if int(p[0]) % 2 == 0 else float(len(c)) for p, c in zip(prompts, completions)]


def test_dynamic_sampling_keeps_only_informative_groups(tiny_model_dir, run_root):
    t = build_trainer(overrides=base(tiny_model_dir, run_root, **{
        "algo.dynamic_sampling": True, "algo.max_sampling_rounds": 8,
        "reward.functions": [f"{__name__}:half_constant"]}))
    batch, stats = t.collect_batch()
    assert stats["dynamic_dropped_groups"] > 0 and stats["sampling_rounds"] > 1
    assert int(batch.group.max()) + 1 == 4  # the batch is full: B groups
    assert informative_groups(batch.rewards, batch.group).all()
    assert all(int(p[0]) % 2 == 1 for p in batch.prompts)


def test_llds_without_iterations_warns(tiny_model_dir, run_root, caplog):
    build_trainer(overrides=base(tiny_model_dir, run_root, **{"algo.llds_lambda": 0.2}))
    assert any("llds_lambda" in r.message for r in caplog.records)
