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
import logging
import math
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml

from tinyrl.agents.config import AgentConfig
from tinyrl.errors import ConfigError
from tinyrl.monitor import MonitorConfig

DEFAULT_PRESET = "tiny_grpo_cpu"
log = logging.getLogger("tinyrl.config")


# --------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    name: str = "tiny-arith"  # a built-in model name, a local path, or a hub id
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    load_in_4bit: bool = False  # QLoRA: nf4 base weights through bitsandbytes
    backend: Literal["transformers", "unsloth"] = "transformers"
    gguf_file: Optional[str] = None  # load this GGUF file of `name` (transformers `gguf_file=`)
    # auto: on only where the run's memory plan says the update does not fit without it (the rule:
    # tinyrl/planner/checkpointing.py); true / false as given
    gradient_checkpointing: Union[bool, Literal["auto"]] = "auto"
    # start from this trained peft adapter (an adapter folder, or a run folder with adapter/); its own
    # LoRA shape (r, alpha, target modules) is used, not lora.*; null: a fresh LoRA adapter
    adapter: Optional[str] = None

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
    engine: Literal["hf", "vllm", "stale"] = "hf"  # stale: tinyrl/rollout/stale.py, a canary test
    num_generations: int = 8  # G: completions per prompt (the group)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    gpu_memory_utilization: float = 0.4  # vLLM only
    max_model_len: int = 1024  # vLLM only

    def validate(self, p: str) -> None:
        _check(self.num_generations >= 2, f"{p}.num_generations", f"must be >= 2 for group-relative advantages, got {self.num_generations}")
        _check(0 < self.temperature < math.inf, f"{p}.temperature", f"must be > 0 and finite, got {self.temperature}")
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
    kl_in_reward: bool = False  # the KL goes into the token rewards (REINFORCE++), not into the loss
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
        _check(0 < self.std_eps < math.inf, f"{p}.std_eps",
               f"must be > 0 and finite (it keeps the advantage's std away from 0; <= 0 can flip or blow up "
               f"advantages), got {self.std_eps}")
        _check(math.isfinite(self.overlong_penalty) and self.overlong_penalty >= 0, f"{p}.overlong_penalty",
               f"must be >= 0 and finite, got {self.overlong_penalty}")
        _check(self.epsilon_low >= 0, f"{p}.epsilon_low", f"must be >= 0, got {self.epsilon_low}")
        _check(self.epsilon_high >= 0, f"{p}.epsilon_high", f"must be >= 0, got {self.epsilon_high}")
        _check(self.dual_clip is None or self.dual_clip > 1, f"{p}.dual_clip", f"must be > 1 or null, got {self.dual_clip}")
        _check(self.beta >= 0, f"{p}.beta", f"must be >= 0, got {self.beta}")
        from tinyrl.algo.advantages import TOKEN_REWARD_ESTIMATORS

        _check(not self.kl_in_reward or self.estimator in TOKEN_REWARD_ESTIMATORS, f"{p}.kl_in_reward",
               f"needs an estimator that takes token rewards ({sorted(TOKEN_REWARD_ESTIMATORS)}), got {self.estimator!r}")
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
    # Seconds one call of one reward function may take (a call scores a whole batch); past it, the
    # call's samples score None (excluded) and the call is counted. null: no limit (the reward then
    # runs on the main thread, for rewards that need it, e.g. ones that install signal handlers).
    timeout: Optional[float] = 300.0

    def validate(self, p: str) -> None:
        _check(len(self.functions) >= 1, f"{p}.functions", "needs at least one reward function")
        for i, spec in enumerate(self.functions):
            _check(math.isfinite(spec.weight), f"{p}.functions[{i}].weight", f"must be a finite number, got {spec.weight}")
        t = self.timeout
        _check(t is None or 0 < t < math.inf, f"{p}.timeout", f"must be > 0 seconds (or null: no timeout), got {t}")


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
        _check(0 < self.lr < math.inf, f"{p}.lr", f"must be > 0 and finite, got {self.lr}")
        _check(0 <= self.weight_decay < math.inf, f"{p}.weight_decay", f"must be >= 0 and finite, got {self.weight_decay}")
        _check(self.max_grad_norm > 0, f"{p}.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        _check(self.warmup_steps >= 0, f"{p}.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _check(self.save_every >= 0, f"{p}.save_every", f"must be >= 0, got {self.save_every}")
        _check(self.keep_last >= 1, f"{p}.keep_last", f"must be >= 1, got {self.keep_last}")


@dataclass
class LogConfig:
    run_dir: str = "runs"
    name: Optional[str] = None  # run folder name; default: preset name + timestamp
    samples_per_step: int = 4  # completions written to samples.jsonl each step
    progress: bool = True
    track_likelihood: bool = True  # re-score the batch after the update: policy KL, update clip frac, LLD

    def validate(self, p: str) -> None:
        _check(self.samples_per_step >= 0, f"{p}.samples_per_step", f"must be >= 0, got {self.samples_per_step}")
        name = self.name
        if name is not None:
            parts = Path(name).parts
            _check(bool(name.strip()) and not Path(name).is_absolute() and ".." not in parts and "." not in parts
                   and "\\" not in name, f"{p}.name",
                   f"must be a folder name inside log.run_dir (no '..', no absolute path), got {name!r}")


@dataclass
class DistConfig:
    """Scale-out (tinyrl.distributed). `nproc` > 1 makes `tinyrl train` re-launch itself through
    `accelerate launch` with the packaged `accelerate_config`; under a launcher the world size is the
    launcher's. train.prompts_per_step is the global batch: it must divide by the process count."""

    nproc: int = 1  # processes (one per GPU); 1 = this process only
    accelerate_config: Literal["ddp", "zero3", "fsdp2"] = "ddp"  # tinyrl/assets/accelerate/<name>.yaml
    timeout_s: float = 600.0  # the longest any process waits for another (a dead or stalled rank)

    def validate(self, p: str) -> None:
        _check(self.nproc >= 1, f"{p}.nproc", f"must be >= 1, got {self.nproc}")
        _check(0 < self.timeout_s < math.inf, f"{p}.timeout_s", f"must be > 0 and finite, got {self.timeout_s}")


@dataclass
class SFTConfig:
    """The `sft` stage and `tinyrl sft` (tinyrl/sft.py): LoRA/QLoRA SFT through TRL's SFTTrainer.

    Rows come from `data`: a jsonl file of prompt/completion rows, a run folder (its
    samples.jsonl, filtered by `min_reward`), "demonstrations" (an agent task's expert
    trajectories, replayed through the run's tools), or, when null, the task's own train rows
    with their `completion_column` (the arithmetic task's true answers)."""

    data: Optional[str] = None  # jsonl file | run folder | "demonstrations" (an agent task's) | null (the task's train rows)
    prompt_column: str = "prompt"
    completion_column: Optional[str] = None  # null: "completion" (files, run folders) or "answer" (task rows)
    min_reward: Optional[float] = None  # keep rows whose `reward` >= this; required for a run folder
    max_per_prompt: Optional[int] = None  # keep at most this many rows per distinct prompt
    epochs: float = 1.0
    max_steps: Optional[int] = None  # optimiser steps; set, it overrides epochs
    lr: float = 2e-4
    batch_size: int = 16  # rows per optimiser step (before grad_accum)
    grad_accum: int = 1
    max_length: Optional[int] = 1024  # tokens per row (prompt + completion); longer rows are cut
    scheduler: Literal["constant", "linear", "cosine"] = "linear"
    warmup_ratio: float = 0.0
    completion_only_loss: bool = True  # loss on completion tokens only (the prompt is context)
    logging_steps: int = 1  # a metrics.jsonl row every N optimiser steps
    save_every: int = 0  # a TRL checkpoint every N optimiser steps; 0 = none (an interrupt still saves one)

    def validate(self, p: str) -> None:
        if self.data is not None and self.data != "demonstrations":  # tinyrl.agents.demonstrations.DEMONSTRATIONS
            path = Path(self.data)
            _check(path.exists(), f"{p}.data", f"not found: {self.data} (a jsonl file of prompt/completion rows or a run folder)")
            if path.is_dir():
                _check((path / "samples.jsonl").is_file(), f"{p}.data", f"{self.data} is a folder without samples.jsonl; is it a tinyrl run folder?")
                _check(self.min_reward is not None, f"{p}.min_reward", "is required when sft.data is a run folder "
                       "(its samples carry rewards; e.g. 1.0 keeps the verifier-correct ones)")
        _check(self.max_per_prompt is None or self.max_per_prompt >= 1, f"{p}.max_per_prompt", f"must be >= 1 or null, got {self.max_per_prompt}")
        _check(self.epochs > 0, f"{p}.epochs", f"must be > 0, got {self.epochs}")
        _check(self.max_steps is None or self.max_steps >= 1, f"{p}.max_steps", f"must be >= 1 or null, got {self.max_steps}")
        _check(self.lr > 0, f"{p}.lr", f"must be > 0, got {self.lr}")
        _check(self.batch_size >= 1, f"{p}.batch_size", f"must be >= 1, got {self.batch_size}")
        _check(self.grad_accum >= 1, f"{p}.grad_accum", f"must be >= 1, got {self.grad_accum}")
        _check(self.max_length is None or self.max_length >= 2, f"{p}.max_length", f"must be >= 2 or null, got {self.max_length}")
        _check(0 <= self.warmup_ratio < 1, f"{p}.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        _check(self.logging_steps >= 1, f"{p}.logging_steps", f"must be >= 1, got {self.logging_steps}")
        _check(self.save_every >= 0, f"{p}.save_every", f"must be >= 0, got {self.save_every}")


@dataclass
class SelfImproveConfig:
    """The `rest_em` and `star` stages (tinyrl/selfimprove.py). Each iteration samples
    `samples_per_prompt` completions for `prompts_per_iter` train prompts from the latest
    iterate, keeps those whose reward >= `min_reward`, and fine-tunes the base (never the
    previous iterate) on them with the `sft` section's switches. STaR also samples
    `hint_samples` completions for each prompt that found no correct one, with the task's hint."""

    iterations: int = 3  # K
    prompts_per_iter: int = 128
    samples_per_prompt: int = 8  # N, at rollout.temperature / top_p / max_new_tokens
    max_per_prompt: Optional[int] = None  # cap on kept completions per prompt (distinct ones first)
    min_reward: float = 1.0  # keep a completion when its total reward (reward.functions) >= this
    hint_samples: int = 4  # STaR rationalisation: samples per failed prompt, with the hint

    def validate(self, p: str) -> None:
        _check(self.iterations >= 1, f"{p}.iterations", f"must be >= 1, got {self.iterations}")
        _check(self.prompts_per_iter >= 1, f"{p}.prompts_per_iter", f"must be >= 1, got {self.prompts_per_iter}")
        _check(self.samples_per_prompt >= 1, f"{p}.samples_per_prompt", f"must be >= 1, got {self.samples_per_prompt}")
        _check(self.max_per_prompt is None or self.max_per_prompt >= 1, f"{p}.max_per_prompt", f"must be >= 1 or null, got {self.max_per_prompt}")
        _check(self.hint_samples >= 0, f"{p}.hint_samples", f"must be >= 0, got {self.hint_samples}")


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
    agent: AgentConfig = field(default_factory=AgentConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    selfimprove: SelfImproveConfig = field(default_factory=SelfImproveConfig)
    # methods run in order, each starting from the previous one's adapter (tinyrl/stages.py),
    # e.g. [sft, grpo]: a cold start then GRPO; empty: GRPO alone
    stages: list[str] = field(default_factory=list)

    def validate(self, p: str = "") -> None:
        from tinyrl.stages import STAGES

        for i, name in enumerate(self.stages):
            _check(name in STAGES, f"stages[{i}]", f"must be one of {sorted(STAGES)}, got {name!r}")
        _check(self.train.prompts_per_step % self.dist.nproc == 0, "train.prompts_per_step",
               f"must divide by dist.nproc = {self.dist.nproc} (every process takes whole groups), "
               f"got {self.train.prompts_per_step}")
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


def resolve_recipe(name: Any, path: str = "algo.recipe") -> dict:
    """The switches a named recipe sets (tinyrl/algo/recipes.py).

    Precedence, from weakest: AlgoConfig's defaults < a layer's recipe < the fields set in that
    same layer < later layers. The layers are the preset, the `--profile`, the command line (each
    may name a recipe). So `tinyrl train algo.recipe=rloo` on a preset that sets `estimator: grpo`
    runs RLOO, while a preset that names `recipe: dapo` and sets `epsilon_high: 0.3` keeps its 0.3."""
    from tinyrl.algo.recipes import RECIPES

    if name not in RECIPES:
        raise ConfigError(f"{path}: must be one of {sorted(RECIPES)}, got {name!r}")
    return {**RECIPES[name], "recipe": name}


def apply_recipe(algo: dict, path: str = "algo.recipe") -> dict:
    """One layer's algo section: its recipe's switches, with the layer's own fields over them."""
    return {**resolve_recipe(algo.get("recipe"), path), **algo} if algo.get("recipe") is not None else dict(algo)


def config_from_dict(data: dict) -> RunConfig:
    """Build and validate a RunConfig from a plain (YAML-shaped) dict."""
    data = dict(data)
    if isinstance(data.get("algo"), dict):
        data["algo"] = apply_recipe(data["algo"])
    return _build(RunConfig, data, "")


# --------------------------------------------------------------------------- presets


def _preset_dir():
    return resources.files("tinyrl.presets")


class _Loader(yaml.SafeLoader):
    """SafeLoader that warns when one mapping gives a key twice (plain YAML keeps the last, silently)."""

    source = "YAML"

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key, line = self.construct_scalar(key_node), key_node.start_mark.line + 1
                if key in seen:
                    log.warning("%s, line %d: key %r is given twice (first on line %d); the later value wins",
                                self.source, line, key, seen[key])
                seen.setdefault(key, line)
        return super().construct_mapping(node, deep)


def load_yaml(text: str, source: str):
    """`yaml.safe_load`, warning about duplicate keys; a YAML error becomes a ConfigError naming `source` and the line."""
    loader = _Loader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}{where}: not valid YAML ({what})") from None
    finally:
        loader.dispose()


def _read_preset_file(entry, label: str) -> dict:
    """The mapping in a preset file; ConfigError for unreadable, binary, malformed, empty or non-mapping files."""
    try:
        text = entry.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"preset {label}: not a text file (not UTF-8); a preset is a YAML mapping of sections") from None
    except OSError as e:
        raise ConfigError(f"preset {label}: cannot read it ({e.strerror or e})") from None
    data = load_yaml(text, f"preset {label}")
    if data is None:
        raise ConfigError(f"preset {label} is empty: it sets nothing. Put sections in it (model:, train:, ...), "
                          f"or run `tinyrl train` with no preset to train the default")
    if not isinstance(data, dict):
        raise ConfigError(f"preset {label}: must be a mapping of sections (model:, train:, ...), "
                          f"got a value of type {type(data).__name__}")
    return data


def list_presets() -> dict[str, str]:
    """Shipped preset names -> their one-line description."""
    out = {}
    for entry in sorted(_preset_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            try:
                raw = _read_preset_file(entry, entry.name)
            except ConfigError as e:
                out[entry.name[:-5]] = f"(cannot be read: {e})"
                continue
            out[entry.name[:-5]] = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
    return out


def read_preset(preset: str | Path | None, _chain: tuple[str, ...] = ()) -> tuple[str, dict]:
    """Return (name, raw dict) of a shipped preset name or a YAML file path.

    `base: OTHER` (a shipped name, or a YAML path relative to this file) starts from OTHER's
    fields: mappings merge key by key (profiles too), any other value replaces the base's."""
    preset = DEFAULT_PRESET if preset is None else str(preset)
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        name, data, here = path.stem, _read_preset_file(path, str(path)), path.parent
    else:
        name = preset[:-5] if preset.endswith(".yaml") else preset
        entry = _preset_dir() / f"{name}.yaml"
        if not entry.is_file():
            if path.is_file():
                raise ConfigError(f"preset {preset!r}: a preset file's name must end in .yaml or .yml")
            known = sorted(list_presets())
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"preset {preset!r} is neither a shipped preset nor a YAML file.{hint} "
                f"Shipped presets: {known} (see `tinyrl presets`)."
            )
        data, here = _read_preset_file(entry, name), None
    base = data.pop("base", None)
    if base is None:
        return name, data
    if not isinstance(base, str):
        raise ConfigError(f"preset {name!r}: base must name a preset (shipped name or YAML path), got {base!r}")
    if here is not None and base.endswith((".yaml", ".yml")) and (here / base).is_file():
        base = str(here / base)
    if name in _chain or base in _chain or Path(base).stem == name:
        raise ConfigError(f"preset {name!r}: base {base!r} leads back to itself ({' -> '.join(_chain + (name,))})")
    return name, _merged(read_preset(base, _chain + (name,))[1], data)


def _merged(under: dict, over: dict) -> dict:
    """`over` on top of `under`: mappings merge key by key, any other value replaces."""
    out = dict(under)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.lr=1e-5` -> (["train", "lr"], 1e-5). Values are read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value, e.g. train.lr=1e-5")
    key, raw = text.split("=", 1)
    keys = key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override {text!r}: empty field name in {key!r}")
    return keys, load_yaml(raw, f"override {text!r}") if raw.strip() else ""


def apply_overrides(data: dict, overrides: dict[str, Any] | list[str]) -> dict:
    """Apply one layer of dotted overrides (["a.b=1"] or {"a.b": 1}) to a nested dict, in place.

    A layer that names `algo.recipe` first sets that recipe's switches over whatever earlier
    layers set; the layer's other fields then win over the recipe (see `resolve_recipe`)."""
    items = [parse_override(o) for o in overrides] if isinstance(overrides, list) else [
        (k.split("."), v) for k, v in overrides.items()
    ]
    for keys, value in sorted(items, key=lambda kv: kv[0] != ["algo", "recipe"]):  # the recipe first
        node = data
        for i, k in enumerate(keys[:-1]):
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"{'.'.join(keys[: i + 1])}: is a value, not a section; cannot set {'.'.join(keys)}")
            node = nxt
        node[keys[-1]] = value
        if keys == ["algo", "recipe"] and value is not None:
            data["algo"] = {**node, **resolve_recipe(value)}
    return data


def _profile_fields(name: str, profile) -> dict[str, Any]:
    """A profile as dotted fields: `{section: {field: value}}` and `{"section.field": value}` alike.

    Only the section level is opened: a field whose value is a mapping (data.task_args) is
    replaced as a whole, as it is by an override. (Issue 15 owns the profiles mechanism; this
    is the reading the shipped GPU presets rely on.)"""
    if not isinstance(profile, dict):
        raise ConfigError(f"profile {name!r}: must be a mapping of sections (train: {{...}}) or dotted "
                          f"fields (train.lr: ...), got {type(profile).__name__}")
    out: dict[str, Any] = {}
    for key, value in profile.items():
        if "." not in str(key) and isinstance(value, dict):
            out.update({f"{key}.{field}": v for field, v in value.items()})
        else:
            out[str(key)] = value
    return out


def load_config(
    preset: str | Path | None = None,
    overrides: dict[str, Any] | list[str] | None = None,
    profile: str | None = None,
) -> tuple[str, RunConfig]:
    """Load a preset, apply a hardware profile and dotted overrides; return (name, config).

    Three layers, each over the one before: the preset, its `profiles[profile]`, the overrides."""
    name, data = read_preset(preset)
    if isinstance(data.get("algo"), dict):
        data["algo"] = apply_recipe(data["algo"])  # the preset's own recipe, under its own fields
    profiles = data.pop("profiles", {}) or {}
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise ConfigError(f"profiles: must map profile names to sections of fields (e.g. 8xh100: {{train: "
                          f"{{prompts_per_step: 64}}}}), got {profiles!r:.80}")
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"--profile {profile!r}: this preset defines {sorted(profiles) or 'no profiles'}")
        apply_overrides(data, _profile_fields(profile, profiles[profile]))  # field by field: the base's other fields stay
    if overrides:
        apply_overrides(data, overrides)
    return name, config_from_dict(data)
