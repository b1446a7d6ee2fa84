"""Presets load and validate; every kind of bad input names the field and what is allowed."""

import pytest

from tinyrl.config import ConfigError, RunConfig, list_presets, load_config


@pytest.mark.parametrize("name", sorted(list_presets()))
def test_every_preset_loads_and_validates(name):
    from importlib import resources

    text = (resources.files("tinyrl.presets") / f"{name}.yaml").read_text()
    assert text.lstrip().startswith("#"), "each preset opens with a comment block"
    assert "Run:" in text and "Memory:" in text
    loaded_name, cfg = load_config(name)
    assert loaded_name == name and isinstance(cfg, RunConfig)
    assert list_presets()[name], "preset needs a one-line description"


def test_default_preset_is_loaded_with_no_name():
    name, cfg = load_config(None)
    assert name == "tiny_grpo_cpu" and cfg.model.name == "tiny-arith"


def test_dotted_overrides_apply_and_coerce():
    _, cfg = load_config(None, ["train.lr=1e-5", 'rollout.stop=["\\n"]', "algo.recipe=dapo", "algo.epsilon_high=0.3"])
    assert cfg.train.lr == 1e-5 and isinstance(cfg.train.lr, float)
    assert cfg.rollout.stop == ["\n"]
    assert cfg.algo.dynamic_sampling is True  # from the recipe
    assert cfg.algo.epsilon_high == 0.3  # explicit field wins over the recipe


def test_reward_spec_shorthand():
    _, cfg = load_config(None, {"reward.functions": ["task", {"name": "x.y:z", "weight": 0.5}]})
    assert [(s.name, s.weight) for s in cfg.reward.functions] == [("task", 1.0), ("x.y:z", 0.5)]


BAD = [
    ({"trian.steps": 3}, "trian: unknown field (did you mean 'train'?)"),
    ({"train.lrr": 0.1}, "train.lrr: unknown field (did you mean 'lr'?)"),
    ({"train.steps": "ten"}, "train.steps: expected int"),
    ({"train.steps": 2.5}, "train.steps: expected int"),
    ({"model.load_in_4bit": "yes"}, "model.load_in_4bit: expected bool"),
    ({"algo.scale": "groups"}, "algo.scale: expected one of 'group', 'batch', 'none'"),
    ({"rollout.temperature": 0}, "rollout.temperature: must be > 0"),
    ({"rollout.num_generations": 1}, "rollout.num_generations: must be >= 2"),
    ({"lora.dropout": 1.5}, "lora.dropout: must be in [0, 1)"),
    ({"train.micro_batch_size": 7}, "train.micro_batch_size: must divide train.prompts_per_step * rollout.num_generations = 128"),
    ({"algo.estimator": "ppo"}, "algo.estimator: must be one of ['dr_grpo', 'grpo', 'reinforce_pp', 'reinforce_pp_baseline', 'rloo']"),
    ({"algo.loss_agg": "mean"}, "algo.loss_agg: must be one of ['constant', 'seq_mean', 'token_mean']"),
    ({"algo.recipe": "ppo"}, "algo.recipe: must be one of"),
    ({"algo.top_entropy_quantile": 1.5}, "algo.top_entropy_quantile: must be in (0, 1]"),
    ({"data.task": "jsonl", "data.path": "/no/such/file.jsonl"}, "data.path: file not found"),
    ({"data.task": "chess"}, "data.task: must be one of"),
    ({"reward.functions": [{"weight": 1.0}]}, "reward.functions[0].name: required field is missing"),
    ({"reward.functions": "task"}, "reward.functions: expected a list of"),
    ({"train.lr.x": 1}, "train.lr: is a value, not a section"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_input_names_the_field(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_unknown_preset_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match=r"preset 'tiny_grpo' .*Did you mean 'tiny_grpo_cpu'"):
        load_config("tiny_grpo")


def test_unknown_profile(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("profiles:\n  8xh100:\n    train.prompts_per_step: 64\n")
    _, cfg = load_config(p, profile="8xh100")
    assert cfg.train.prompts_per_step == 64
    with pytest.raises(ConfigError, match=r"--profile 'tpu': this preset defines \['8xh100'\]"):
        load_config(p, profile="tpu")


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="expected section.field=value"):
        load_config(None, ["train.lr"])


def test_yaml_file_unknown_nested_key(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("lora:\n  rank: 8\n")
    with pytest.raises(ConfigError, match=r"lora.rank: unknown field.*allowed: \['r', 'alpha', 'dropout', 'target_modules'\]"):
        load_config(p)
