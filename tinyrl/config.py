"""Typed run configuration: nested dataclasses, YAML presets, dotted overrides.

A run is described by one `RunConfig` with eight sections (model, lora, rollout, algo,
data, reward, train, log). `load_config` reads a preset (a shipped name or a YAML path),
applies an optional hardware profile and `section.field=value` overrides, and builds the
dataclasses field by field, so every wrong key or value fails at load with the dotted
path of the field and what it accepts.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from tinyrl.errors import ConfigError
from tinyrl.monitor import MonitorConfig

DEFAULT_PRESET = "tiny_grpo_cpu"


# --------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    name: str = "tiny-arith"  # a built-in model name, a local path, or a hub id
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    load_in_4bit: bool = False  # QLoRA: nf4 base weights through bitsandbytes
    backend: Literal["transformers", "unsloth"] = "transformers"
    gguf_file: Optional[str] = None  # load this GGUF file of `name` (transformers `gguf_file=`)
    gradient_checkpointing: bool = False

    def validate(self, p: str) -> None:
        _check(bool(self.name), f"{p}.name", "must name a model (built-in, local path or hub id)")


@dataclass
class LoraConfig:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: Union[str, list[str]] = "all-linear"

    def validate(self, p: str) -> None:
        _check(self.r >= 1, f"{p}.r", f"must be >= 1, got {self.r}")
        _check(self.alpha >= 1, f"{p}.alpha", f"must be >= 1, got {self.alpha}")
        _check(0.0 <= self.dropout < 1.0, f"{p}.dropout", f"must be in [0, 1), got {self.dropout}")


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    num_generations: int = 8  # G: completions per prompt (the group)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    gpu_memory_utilization: float = 0.4  # vLLM only
    max_model_len: int = 1024  # vLLM only

    def validate(self, p: str) -> None:
        _check(self.num_generations >= 2, f"{p}.num_generations", f"must be >= 2 for group-relative advantages, got {self.num_generations}")
        _check(self.temperature > 0, f"{p}.temperature", f"must be > 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"{p}.top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.max_new_tokens >= 1, f"{p}.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        _check(0 < self.gpu_memory_utilization <= 1, f"{p}.gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass
class AlgoConfig:
    """The GRPO family as independent switches; `recipe` fills them in first (see algo/recipes.py)."""

    recipe: Optional[str] = None
    estimator: str = "grpo"  # a name in tinyrl.algo.advantages.ESTIMATORS
    scale: Literal["group", "batch", "none"] = "group"  # std used to scale advantages
    std_eps: float = 1e-4
    loss_agg: str = "token_mean"  # a name in tinyrl.algo.losses.AGGREGATIONS
    ratio_level: Literal["token", "sequence"] = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: Optional[float] = None  # c > 1: bound the loss of negative-advantage tokens at c * |A|
    beta: float = 0.0  # KL-to-reference weight; 0 skips the reference pass entirely
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    num_iterations: int = 1  # optimiser passes over one rollout batch
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal, resample
    max_sampling_rounds: int = 3  # cap on extra generation rounds for dynamic sampling
    overlong_buffer: int = 0  # DAPO soft overlong punishment window (tokens); 0 = off
    overlong_penalty: float = 1.0
    mask_truncated: bool = False  # exclude completions that hit max_new_tokens from the loss
    tis: Literal["none", "token", "sequence"] = "none"  # truncated IS correction rollout -> trainer
    tis_mode: Literal["truncate", "mask"] = "truncate"
    tis_cap: float = 3.0
    top_entropy_quantile: Optional[float] = None  # train only on the top-q highest-entropy tokens
    llds_lambda: float = 0.0  # lazy-likelihood-displacement stabiliser weight (0.2 when on)
    loss_impl: Literal["auto", "torch", "triton"] = "auto"  # fused linear loss backend
    chunk_size: int = 1024  # tokens per chunk in the fused linear loss

    def validate(self, p: str) -> None:
        from tinyrl.algo.advantages import ESTIMATORS
        from tinyrl.algo.losses import AGGREGATIONS

        _check(self.estimator in ESTIMATORS, f"{p}.estimator", f"must be one of {sorted(ESTIMATORS)}, got {self.estimator!r}")
        _check(self.loss_agg in AGGREGATIONS, f"{p}.loss_agg", f"must be one of {sorted(AGGREGATIONS)}, got {self.loss_agg!r}")
        _check(self.epsilon_low >= 0, f"{p}.epsilon_low", f"must be >= 0, got {self.epsilon_low}")
        _check(self.epsilon_high >= 0, f"{p}.epsilon_high", f"must be >= 0, got {self.epsilon_high}")
        _check(self.dual_clip is None or self.dual_clip > 1, f"{p}.dual_clip", f"must be > 1 or null, got {self.dual_clip}")
        _check(self.beta >= 0, f"{p}.beta", f"must be >= 0, got {self.beta}")
        _check(self.num_iterations >= 1, f"{p}.num_iterations", f"must be >= 1, got {self.num_iterations}")
        _check(self.max_sampling_rounds >= 0, f"{p}.max_sampling_rounds", f"must be >= 0, got {self.max_sampling_rounds}")
        _check(self.overlong_buffer >= 0, f"{p}.overlong_buffer", f"must be >= 0, got {self.overlong_buffer}")
        _check(self.tis_cap > 0, f"{p}.tis_cap", f"must be > 0, got {self.tis_cap}")
        q = self.top_entropy_quantile
        _check(q is None or 0 < q <= 1, f"{p}.top_entropy_quantile", f"must be in (0, 1] or null, got {q}")
        _check(self.llds_lambda >= 0, f"{p}.llds_lambda", f"must be >= 0, got {self.llds_lambda}")
        _check(self.chunk_size >= 1, f"{p}.chunk_size", f"must be >= 1, got {self.chunk_size}")


@dataclass
class DataConfig:
    task: str = "arithmetic"  # a built-in task name (tinyrl.tasks.TASKS) or "jsonl"
    path: Optional[str] = None  # for task: jsonl, a local .jsonl file with a prompt column
    prompt_column: str = "prompt"
    num_train: int = 2000
    num_eval: int = 200
    seed: int = 0
    chat_template: Literal["auto", "always", "never"] = "auto"
    system_prompt: Optional[str] = None
    task_args: dict = field(default_factory=dict)  # passed to the task's builder

    def validate(self, p: str) -> None:
        from tinyrl.tasks import TASKS

        allowed = sorted(TASKS) + ["jsonl"]
        _check(self.task in allowed, f"{p}.task", f"must be one of {allowed}, got {self.task!r}")
        if self.task == "jsonl":
            _check(self.path is not None, f"{p}.path", "is required when data.task is 'jsonl'")
            _check(Path(self.path).is_file(), f"{p}.path", f"file not found: {self.path}")
        _check(self.num_train >= 1, f"{p}.num_train", f"must be >= 1, got {self.num_train}")
        _check(self.num_eval >= 0, f"{p}.num_eval", f"must be >= 0, got {self.num_eval}")


@dataclass
class RewardSpec:
    name: str  # a registry name (tinyrl.rewards.REWARDS) or "package.module:function"
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)  # bound to the function before the call


@dataclass
class RewardConfig:
    functions: list[RewardSpec] = field(default_factory=lambda: [RewardSpec("task")])
    combine: Literal["sum", "normalize_then_sum", "sum_then_normalize"] = "sum"

    def validate(self, p: str) -> None:
        _check(len(self.functions) >= 1, f"{p}.functions", "needs at least one reward function")


@dataclass
class TrainConfig:
    steps: int = 40
    prompts_per_step: int = 8  # B: prompts per rollout batch (B*G completions)
    micro_batch_size: int = 16  # completions per forward/backward
    lr: float = 5e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    scheduler: Literal["constant", "linear", "cosine"] = "constant"
    seed: int = 0
    save_every: int = 0  # checkpoint every N steps; 0 = only at the end
    keep_last: int = 2
    eval_before_after: bool = True  # held-out accuracy before and after training

    def validate(self, p: str) -> None:
        _check(self.steps >= 0, f"{p}.steps", f"must be >= 0, got {self.steps}")
        _check(self.prompts_per_step >= 1, f"{p}.prompts_per_step", f"must be >= 1, got {self.prompts_per_step}")
        _check(self.micro_batch_size >= 1, f"{p}.micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        _check(self.lr > 0, f"{p}.lr", f"must be > 0, got {self.lr}")
        _check(self.max_grad_norm > 0, f"{p}.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        _check(self.save_every >= 0, f"{p}.save_every", f"must be >= 0, got {self.save_every}")
        _check(self.keep_last >= 1, f"{p}.keep_last", f"must be >= 1, got {self.keep_last}")


@dataclass
class LogConfig:
    run_dir: str = "runs"
    name: Optional[str] = None  # run folder name; default: preset name + timestamp
    samples_per_step: int = 4  # completions written to samples.jsonl each step
    progress: bool = True
    track_likelihood: bool = True  # re-score the batch after the update: policy KL, update clip frac, LLD


@dataclass
class RunConfig:
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

    def validate(self, p: str = "") -> None:
        completions = self.train.prompts_per_step * self.rollout.num_generations
        _check(
            completions % self.train.micro_batch_size == 0,
            "train.micro_batch_size",
            f"must divide train.prompts_per_step * rollout.num_generations = {completions}, got {self.train.micro_batch_size}",
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- building


def _check(ok: bool, path: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {msg}")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping with keys {[f.name for f in dataclasses.fields(tp)]}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Turn a YAML value into `tp`, or raise ConfigError naming `path` and what is allowed."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise bad
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError:
                continue
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if isinstance(value, str) and tp is RewardSpec:
            value = {"name": value}
        if not isinstance(value, dict):
            raise bad
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if tp is dict:
        if not isinstance(value, dict):
            raise bad
        return value
    raise TypeError(f"config field type {tp!r} at {path} is not supported")


def _build(cls: type, data: dict, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown field{hint}; allowed: {names}")
        kwargs[key] = _coerce(value, hints[key], where)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path}.{missing[0]}: required field is missing")
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        obj.validate(path)
    return obj


def apply_recipe(algo: dict, path: str = "algo.recipe") -> dict:
    """Return the algo section with the named recipe's switches filled in under the user's."""
    from tinyrl.algo.recipes import RECIPES

    name = algo.get("recipe")
    if name not in RECIPES:
        raise ConfigError(f"{path}: must be one of {sorted(RECIPES)}, got {name!r}")
    return {**RECIPES[name], **algo}


def config_from_dict(data: dict) -> RunConfig:
    """Build and validate a RunConfig from a plain (YAML-shaped) dict."""
    data = dict(data)
    algo = data.get("algo")
    if isinstance(algo, dict) and algo.get("recipe") is not None:
        data["algo"] = apply_recipe(algo, path="algo.recipe")
    return _build(RunConfig, data, "")


# --------------------------------------------------------------------------- presets


def _preset_dir():
    return resources.files("tinyrl.presets")


def list_presets() -> dict[str, str]:
    """Shipped preset names -> their one-line description."""
    out = {}
    for entry in sorted(_preset_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            raw = yaml.safe_load(entry.read_text()) or {}
            out[entry.name[:-5]] = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
    return out


def read_preset(preset: str | Path | None, _chain: tuple[str, ...] = ()) -> tuple[str, dict]:
    """Return (name, raw dict) of a shipped preset name or a YAML file path.

    `base: OTHER` (a shipped name, or a YAML path relative to this file) starts from OTHER's
    fields: mappings merge key by key (profiles too), any other value replaces the base's."""
    preset = DEFAULT_PRESET if preset is None else str(preset)
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        name, data, here = path.stem, yaml.safe_load(path.read_text()) or {}, path.parent
    else:
        name = preset[:-5] if preset.endswith(".yaml") else preset
        entry = _preset_dir() / f"{name}.yaml"
        if not entry.is_file():
            known = sorted(list_presets())
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"preset {preset!r} is neither a shipped preset nor a YAML file.{hint} "
                f"Shipped presets: {known} (see `tinyrl presets`)."
            )
        data, here = yaml.safe_load(entry.read_text()) or {}, None
    base = data.pop("base", None)
    if base is None:
        return name, data
    if not isinstance(base, str):
        raise ConfigError(f"preset {name!r}: base must name a preset (shipped name or YAML path), got {base!r}")
    if here is not None and base.endswith((".yaml", ".yml")) and (here / base).is_file():
        base = str(here / base)
    if name in _chain or base in _chain or Path(base).stem == name:
        raise ConfigError(f"preset {name!r}: base {base!r} leads back to itself ({' -> '.join(_chain + (name,))})")

    def merged(under: dict, over: dict) -> dict:
        out = dict(under)
        for k, v in over.items():
            out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    return name, merged(read_preset(base, _chain + (name,))[1], data)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.lr=1e-5` -> (["train", "lr"], 1e-5). Values are read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value, e.g. train.lr=1e-5")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override {text!r}: empty field name in {key!r}")
    return keys, yaml.safe_load(raw) if raw.strip() else ""


def apply_overrides(data: dict, overrides: dict[str, Any] | list[str]) -> dict:
    """Apply dotted overrides (["a.b=1"] or {"a.b": 1}) to a nested dict, in place."""
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else [
        (k.split("."), v) for k, v in overrides.items()
    ]
    for keys, value in items:
        node = data
        for i, k in enumerate(keys[:-1]):
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{'.'.join(keys[: i + 1])}: is a value, not a section; cannot set {'.'.join(keys)}")
            node = nxt
        node[keys[-1]] = value
    return data


def load_config(
    preset: str | Path | None = None,
    overrides: dict[str, Any] | list[str] | None = None,
    profile: str | None = None,
) -> tuple[str, RunConfig]:
    """Load a preset, apply a hardware profile and dotted overrides; return (name, config)."""
    name, data = read_preset(preset)
    profiles = data.pop("profiles", {}) or {}
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"--profile {profile!r}: this preset defines {sorted(profiles) or 'no profiles'}")
        apply_overrides(data, profiles[profile])
    if overrides:
        apply_overrides(data, overrides)
    return name, config_from_dict(data)
