"""The run configuration: typed sections, presets and their layers, and the one resolution of a run.

    schema.py          the sections (RunConfig and one dataclass each), each checking its own fields
    schema_*.py        the sections of the agent, the monitor, SFT and ReST-EM / STaR
    coerce.py          YAML-shaped dicts -> dataclasses, field by field, errors naming the field
    presets.py         preset files, `base:`, hardware profiles, dotted overrides, recipes
    resolve.py         (preset, profile, overrides, resume) -> `Resolved`, once per run

Importing it loads no model, rollout, retriever or method code: names that point into registries
(tasks, estimators, methods, tools) are checked against the registries' keys.
"""

from tinyrl.config.coerce import build, check
from tinyrl.config.presets import (
    DEFAULT_PRESET,
    apply_overrides,
    apply_recipe,
    list_presets,
    load_yaml,
    parse_override,
    preset_layers,
    read_preset,
    resolve_recipe,
)
from tinyrl.config.resolve import (
    Resolved,
    check_names,
    config_changes,
    config_from_dict,
    decide_dtype,
    dotted,
    load_config,
    resolve,
    with_fields,
)
from tinyrl.config.schema import (
    AlgoConfig,
    DataConfig,
    DistConfig,
    LogConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RewardSpec,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)
from tinyrl.config.schema_agent import AgentConfig
from tinyrl.config.schema_methods import SelfImproveConfig, SFTConfig
from tinyrl.config.schema_monitor import MonitorConfig
from tinyrl.errors import ConfigError

__all__ = ["DEFAULT_PRESET", "AgentConfig", "AlgoConfig", "ConfigError", "DataConfig", "DistConfig", "LogConfig",
           "LoraConfig", "ModelConfig", "MonitorConfig", "Resolved", "RewardConfig", "RewardSpec", "RolloutConfig",
           "RunConfig", "SFTConfig", "SelfImproveConfig", "TrainConfig", "apply_overrides", "apply_recipe", "build",
           "check", "check_names", "config_changes", "config_from_dict", "dotted", "list_presets", "load_config",
           "load_yaml", "parse_override", "preset_layers", "read_preset", "resolve", "resolve_recipe", "decide_dtype", "with_fields"]
