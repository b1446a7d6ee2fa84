"""One resolution of a run: (preset, profile, overrides, resume folder) -> a validated `RunConfig`.

Every entry point (the CLI, the Python API, the UI's launcher, notebooks) calls `resolve` once
and passes its `Resolved` on; nothing downstream reads a preset again. Resolution

1. layers the preset, its hardware profile and the dotted overrides (or, to resume, the run
   folder's own config.yaml and the overrides) into one YAML-shaped dict, `written`: what the
   run folder's config.yaml holds;
2. builds it field by field (`tinyrl.config.coerce`), each section checking its own values, then
   checks every name that points into a registry (`check_names`: tasks, advantage estimators,
   loss aggregations, agent formats and tools, methods; the torch-free tables of tinyrl.names)
   without importing what they name, and refuses the combinations of switches that do not compose
   (`tinyrl.config.switches`);
3. checks the run against its model and this device, once, before any run folder exists
   (tinyrl.planner.preflight): refuses a completion budget beyond the model's context and a planned
   peak above the device's memory, and decides the `auto` settings (model.gradient_checkpointing).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinyrl.config.coerce import build, check
from tinyrl.config.presets import apply_overrides, apply_recipe, preset_layers
from tinyrl.config.schema import RunConfig
from tinyrl.config.switches import check_installed, check_switches
from tinyrl.errors import ConfigError
from tinyrl.hardware import BF16_FROM, compute_dtype, cuda_capability
from tinyrl.methods.registry import METHODS
from tinyrl.names import (
    AGGREGATIONS,
    ESTIMATORS,
    FORMATS,
    SANDBOX_KWARGS,
    SANDBOX_LIMITS,
    TASK_ARGS,
    TOKEN_REWARD_ESTIMATORS,
    TOOLS,
)
from tinyrl.planner import preflight
from tinyrl.registry import load_object
from tinyrl.runs import RunDir
from tinyrl.tasks import TASKS

log = logging.getLogger("tinyrl.config")


def check_names(cfg: RunConfig) -> None:
    """Every config value that names a registry entry is one of its names (ConfigError naming the field)."""
    a, d, ag = cfg.algo, cfg.data, cfg.agent
    check(a.estimator in ESTIMATORS, "algo.estimator", f"must be one of {sorted(ESTIMATORS)}, got {a.estimator!r}")
    check(a.loss_agg in AGGREGATIONS, "algo.loss_agg", f"must be one of {sorted(AGGREGATIONS)}, got {a.loss_agg!r}")
    check(not a.kl_in_reward or a.estimator in TOKEN_REWARD_ESTIMATORS, "algo.kl_in_reward",
          f"needs an estimator that takes token rewards ({sorted(TOKEN_REWARD_ESTIMATORS)}), got {a.estimator!r}")
    tasks = sorted(TASKS) + ["jsonl"]
    check(d.task in tasks, "data.task", f"must be one of {tasks}, got {d.task!r}")
    check(ag.format in FORMATS, "agent.format", f"must be one of {sorted(FORMATS)}, got {ag.format!r}")
    for i, t in enumerate(ag.tools):
        check(t in TOOLS or (":" in t and all(t.split(":", 1))), f"agent.tools[{i}]",
              f"must be one of {sorted(TOOLS)} or 'module:function', got {t!r}")
    for i, name in enumerate(cfg.stages):
        check(name in METHODS, f"stages[{i}]", f"must be one of {sorted(METHODS)}, got {name!r}")
    if d.task in TASK_ARGS:  # the task's own arguments, bounded before any data is read (loads that task)
        TASK_ARGS[d.task](d.task_args)
    for i, spec in enumerate(cfg.reward.functions):
        if any(k in spec.kwargs for k in SANDBOX_KWARGS):
            load_object(SANDBOX_LIMITS)(spec.kwargs, f"reward.functions[{i}].kwargs")


def config_from_dict(data: dict) -> RunConfig:
    """Build and validate a RunConfig from a plain (YAML-shaped) dict."""
    data = dict(data)
    if isinstance(data.get("algo"), dict):
        data["algo"] = apply_recipe(data["algo"])
    cfg = build(RunConfig, data, "")
    check_names(cfg)
    check_switches(cfg)
    return cfg


def load_config(preset: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None,
                profile: str | None = None) -> tuple[str, RunConfig]:
    """(name, validated RunConfig) of a preset with a hardware profile and dotted overrides; no `auto`
    decided (that is `resolve`'s, for the process that runs it)."""
    name, data = preset_layers(preset, overrides, profile)
    return name, config_from_dict(data)


@dataclass
class Resolved:
    """A run, resolved once: what every method and entry point receives."""

    name: str  # the run folder's name: the preset's (or log.name), or the resumed folder's
    cfg: RunConfig  # validated, `auto` settings decided: what the run trains with
    written: dict  # the config as the run folder's config.yaml holds it (`auto` left for each run to decide)
    resume: Path | None = None  # the run folder to continue; None: a fresh one under cfg.log.run_dir
    overrides: dict = field(default_factory=dict)  # the dotted overrides given (a resume records them)

    @property
    def method(self) -> str:
        """The method this run executes: a single stage, `chain` for several, `grpo` for none."""
        stages = self.cfg.stages
        return "grpo" if not stages else stages[0] if len(stages) == 1 else "chain"


def dotted(overrides: dict | None) -> dict:
    """Accept both {"train.steps": 5} and {"train": {"steps": 5}} (flattened to dotted keys).

    >>> dotted({"train": {"steps": 5}, "log.progress": False})
    {'train.steps': 5, 'log.progress': False}
    """
    out = {}
    for k, v in (overrides or {}).items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in dotted(v).items()})
        else:
            out[k] = v
    return out


def resolve(preset: str | Path | None = None, profile: str | None = None, overrides: dict | None = None,
            resume: str | Path | None = None, decide_auto: bool = True) -> Resolved:
    """The one resolution of a run (see the module docstring). `resume`: a run folder to continue with
    its own config.yaml (a preset or profile given beside it is ignored, with a warning)."""
    overrides = dotted(overrides)
    if resume is not None:
        path = Path(resume)
        if preset is not None or profile is not None:
            ignored = " and ".join(x for x in (preset and f"the preset {preset!r}", profile and f"--profile {profile}")
                                   if x)
            log.warning("--resume %s: %s ignored; the run continues with its own config.yaml "
                        "(section.field=value overrides still apply)", path, ignored)
        written = apply_overrides(copy.deepcopy(RunDir(path).config()), overrides)
        try:
            cfg = config_from_dict(written)
        except ConfigError as e:
            raise ConfigError(f"{path / 'config.yaml'}{' with the overrides' if overrides else ''}: {e}") from None
        name = path.name
    else:
        name, data = preset_layers(preset, overrides, profile)
        cfg = config_from_dict(data)
        written, path = cfg.to_dict(), None
        name = cfg.log.name or name
    cfg = decide_off_policy(cfg)  # (no hardware in it: decided for every caller)
    if decide_auto:  # the process that trains: `auto` decided, a run that cannot work refused (no folder yet)
        check_installed(cfg)  # the optional packages it needs
        cfg = preflight.check(decide_dtype(cfg))  # model.dtype auto first: the plan depends on it
    return Resolved(name, cfg, written, path, overrides)


def decide_off_policy(cfg: RunConfig) -> RunConfig:
    """algo.off_policy auto: `decoupled` (AReaL's decoupled PPO) when a batch holds tokens of older policy
    versions (rollout.max_staleness > 0: partial rollouts, one-step-off), else `tis` (the synchronous loss).
    Uncorrected, one-step-off collapsed the tiny search agent on 2 of 3 seeds (benchmarks/async_rollout.py)."""
    if cfg.algo.off_policy != "auto":
        return cfg
    mode = "decoupled" if cfg.rollout.max_staleness > 0 else "tis"
    return dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, off_policy=mode))


def decide_dtype(cfg: RunConfig, capability: int | None | str = "this process") -> RunConfig:
    """`cfg` with model.dtype auto decided for a card of `capability` (default: this process's; None: a
    CPU), logged with why; any other dtype as given."""
    if cfg.model.dtype != "auto":
        return cfg
    cc = cuda_capability() if capability == "this process" else capability
    dtype = compute_dtype(cc)
    why = "a CPU" if cc is None else f"sm_{cc}" + ("" if cc >= BF16_FROM else ", which has no bf16")
    log.info("model.dtype auto -> %s (%s)", dtype, why)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))


def with_fields(cfg: RunConfig, patch: dict[str, Any]) -> RunConfig:
    """`cfg` with dotted fields set (`{"algo.epsilon_high": 0.28}`: the monitor's actions), built and
    checked like any config; its model section (its `auto` settings decided) is kept as it is."""
    if not patch:
        return cfg
    data = cfg.to_dict()
    for key, value in patch.items():
        section, name = key.split(".", 1)
        data[section][name] = value
    return dataclasses.replace(config_from_dict(data), model=cfg.model)


def config_changes(before: dict, after: dict, prefix: str = "") -> dict[str, tuple]:
    """Dotted field -> (before, after) for every field that differs between two config dicts.

    >>> config_changes({"train": {"lr": 0.1, "steps": 5}}, {"train": {"lr": 0.1, "steps": 9}})
    {'train.steps': (5, 9)}
    """
    out = {}
    for key in list(before) + [k for k in after if k not in before]:
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(config_changes(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out
