"""The run config's sections: one dataclass each, with the checks a field can make on its own.

A run is one `RunConfig`. Each section's `validate(path)` checks its own values (ranges, paths,
combinations) and names the field it rejects; names that point into a registry (a task, an
advantage estimator, a method) are checked once the whole config is built, by
`tinyrl.config.resolve.check_names`, so this module imports no task, algorithm or method code.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Union

from tinyrl.config.coerce import check, check_local
from tinyrl.config.schema_agent import AgentConfig
from tinyrl.config.schema_data import DataFilter, MixSource, check_columns, check_mix, check_split_spec
from tinyrl.config.schema_methods import SelfImproveConfig, SFTConfig
from tinyrl.config.schema_monitor import MonitorConfig
from tinyrl.config.server_url import check_server_fields
from tinyrl.templates import check_template
from tinyrl.trackers.registry import TRACKERS  # names only: checking one imports no tracker


@dataclass
class ModelConfig:
    name: str = "tiny-arith"  # a built-in model name, a local path, or a hub id
    # auto: float32 on a CPU, bfloat16 on a card that has it (sm_80+), float16 below (a T4); decided once
    # per run (tinyrl.config.resolve), logged at start
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    load_in_4bit: bool = False  # QLoRA: nf4 base weights through bitsandbytes
    # int8 / fp8: the frozen base linears quantized weight-only through torchao (1 byte a parameter plus
    # per-row scales; embeddings and head stay 16-bit); with rollout.engine vllm, vLLM quantizes the base
    # and the trainer's frozen tensors are views of it (one copy). Exclusive with load_in_4bit.
    quantization: Literal["none", "int8", "fp8"] = "none"
    backend: Literal["transformers", "unsloth"] = "transformers"
    gguf_file: Optional[str] = None  # load this GGUF file of `name` (transformers `gguf_file=`)
    # auto: on only where the run's memory plan says the update does not fit without it (the rule:
    # tinyrl/planner/checkpointing.py); true / false as given
    gradient_checkpointing: Union[bool, Literal["auto"]] = "auto"
    # start from this trained peft adapter (an adapter folder, or a run folder with adapter/); its own
    # LoRA shape (r, alpha, target modules) is used, not lora.*; null: a fresh LoRA adapter
    adapter: Optional[str] = None

    def validate(self, p: str) -> None:
        check(bool(self.name), f"{p}.name", "must name a model (built-in, local path or hub id)")
        check(not (self.load_in_4bit and self.quantization != "none"), f"{p}.quantization",
              f"{self.quantization!r} and {p}.load_in_4bit: true are exclusive (two ways to quantize the base): "
              f"set {p}.quantization: none for QLoRA nf4, or {p}.load_in_4bit: false for int8 / fp8")
        check(not (self.backend == "unsloth" and self.quantization != "none"), f"{p}.quantization",
              f"{self.quantization!r} needs {p}.backend: transformers (unsloth loads its own 4-bit base); "
              f"allowed with unsloth: none")


@dataclass
class LoraConfig:
    LIMITS = {"r": (1, 4096), "alpha": (1, 65536)}

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: Union[str, list[str]] = "all-linear"

    def validate(self, p: str) -> None:
        check(self.r >= 1, f"{p}.r", f"must be >= 1, got {self.r}")
        check(self.alpha >= 1, f"{p}.alpha", f"must be >= 1, got {self.alpha}")
        check(0.0 <= self.dropout < 1.0, f"{p}.dropout", f"must be in [0, 1), got {self.dropout}")


@dataclass
class RolloutConfig:
    LIMITS = {"num_generations": (2, 1024), "max_new_tokens": (1, 131072), "max_model_len": (1, 10_000_000),
              "max_staleness": (0, 64), "inflight_groups": (1, 65536),  # (inflight_groups <= 8 B: RunConfig)
              "server_timeout_s": (0, 86400), "server_retry_s": (0, 86400)}

    # vllm_server: a vLLM OpenAI-compatible server beside the trainer (tinyrl/rollout/vllm_server.py, `tinyrl serve`)
    engine: Literal["hf", "vllm", "vllm_server", "stale"] = "hf"  # stale: tinyrl/rollout/stale.py, a canary test
    num_generations: int = 8  # G: completions per prompt (the group)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    gpu_memory_utilization: float = 0.4  # vLLM only
    max_model_len: int = 1024  # vLLM only
    # Partial rollouts (tinyrl.inflight): 0 = synchronous, every step waits for its longest group.
    # k >= 1: a step trains on the groups that completed; the rest continue into the next step under the
    # new adapter; a group holding a token sampled more than k policy versions ago is dropped (counted).
    max_staleness: int = 0
    overlap: bool = False  # one-step-off: the next step's batch is collected during this step's update (tinyrl.overlap)
    inflight_groups: Optional[int] = None  # groups in flight when max_staleness > 0; None: B + B//4 (at least B + 1)
    # vllm_server: the servers' base URLs (http://HOST:PORT; several: requests balanced over them), the longest one
    # request may take, how long a failing server is retried (with back-off) before the run stops with an error,
    # and a folder the servers read the adapter versions from at the same path (null: /dev/shm, this machine)
    server_url: Union[list[str], str] = field(default_factory=list)
    server_timeout_s: float = 600.0
    server_retry_s: float = 120.0
    server_adapter_dir: Optional[str] = None

    def __post_init__(self):
        if isinstance(self.server_url, str):
            self.server_url = [self.server_url]

    def validate(self, p: str) -> None:
        check(self.num_generations >= 2, f"{p}.num_generations", f"must be >= 2 for group-relative advantages, got {self.num_generations}")
        check(0 < self.temperature < math.inf, f"{p}.temperature", f"must be > 0 and finite, got {self.temperature}")
        check(0 < self.top_p <= 1, f"{p}.top_p", f"must be in (0, 1], got {self.top_p}")
        check(self.max_new_tokens >= 1, f"{p}.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        check(0 < self.gpu_memory_utilization <= 1, f"{p}.gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")
        check(self.max_staleness >= 0, f"{p}.max_staleness", f"must be >= 0 (0: synchronous), got {self.max_staleness}")
        check(not self.overlap or self.max_staleness >= 1, f"{p}.overlap",
              "trains on tokens one policy version old: it needs rollout.max_staleness >= 1")
        g = self.inflight_groups
        check(g is None or g >= 1, f"{p}.inflight_groups", f"must be >= 1 or null, got {g}")
        check_server_fields(self, p)  # rollout.server_* (tinyrl/config/server_url.py)


@dataclass
class AlgoConfig:
    """The GRPO family as independent switches; `recipe` fills them in first (see algo/recipes.py)."""

    LIMITS = {"num_iterations": (1, 64), "max_sampling_rounds": (0, 64), "overlong_buffer": (0, 131072),
              "chunk_size": (1, 1 << 20)}

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
    # How the loss treats the behaviour policy (the engine's logprobs of each sampled token), tinyrl.algo.losses:
    # tis: today's, the `tis` switches above; bypass: the behaviour logprobs are the old policy (no proximal
    # pass); decoupled: AReaL's decoupled PPO, the clip around the weights at the step's start and the
    # behaviour ratio a weight, tokens above off_policy_cap masked out
    # auto: decoupled when the batches mix policy versions (rollout.max_staleness > 0), else tis (resolve decides)
    off_policy: Literal["auto", "tis", "bypass", "decoupled"] = "auto"
    off_policy_cap: float = 5.0
    top_entropy_quantile: Optional[float] = None  # train only on the top-q highest-entropy tokens
    llds_lambda: float = 0.0  # lazy-likelihood-displacement stabiliser weight (0.2 when on)
    loss_impl: Literal["auto", "torch", "triton"] = "auto"  # fused linear loss backend
    chunk_size: int = 1024  # tokens per chunk in the fused linear loss

    def validate(self, p: str) -> None:
        check(0 < self.std_eps < math.inf, f"{p}.std_eps",
               f"must be > 0 and finite (it keeps the advantage's std away from 0; <= 0 can flip or blow up "
               f"advantages), got {self.std_eps}")
        check(math.isfinite(self.overlong_penalty) and self.overlong_penalty >= 0, f"{p}.overlong_penalty",
               f"must be >= 0 and finite, got {self.overlong_penalty}")
        check(self.epsilon_low >= 0, f"{p}.epsilon_low", f"must be >= 0, got {self.epsilon_low}")
        check(self.epsilon_high >= 0, f"{p}.epsilon_high", f"must be >= 0, got {self.epsilon_high}")
        check(self.dual_clip is None or self.dual_clip > 1, f"{p}.dual_clip", f"must be > 1 or null, got {self.dual_clip}")
        check(self.beta >= 0, f"{p}.beta", f"must be >= 0, got {self.beta}")
        check(self.num_iterations >= 1, f"{p}.num_iterations", f"must be >= 1, got {self.num_iterations}")
        check(self.max_sampling_rounds >= 0, f"{p}.max_sampling_rounds", f"must be >= 0, got {self.max_sampling_rounds}")
        check(self.overlong_buffer >= 0, f"{p}.overlong_buffer", f"must be >= 0, got {self.overlong_buffer}")
        check(self.tis_cap > 0, f"{p}.tis_cap", f"must be > 0, got {self.tis_cap}")
        check(self.off_policy_cap > 1, f"{p}.off_policy_cap", f"must be > 1, got {self.off_policy_cap}")
        q = self.top_entropy_quantile
        check(q is None or 0 < q <= 1, f"{p}.top_entropy_quantile", f"must be in (0, 1] or null, got {q}")
        check(self.llds_lambda >= 0, f"{p}.llds_lambda", f"must be >= 0, got {self.llds_lambda}")
        check(self.chunk_size >= 1, f"{p}.chunk_size", f"must be >= 1, got {self.chunk_size}")


DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")  # data.dataset files (tinyrl.datasets_source)


@dataclass
class DataConfig:
    LIMITS = {"num_train": (1, 10_000_000), "num_eval": (0, 1_000_000), "seed": (0, 2**32 - 1)}

    # a built-in task name (tinyrl.tasks.TASKS), "jsonl", or "dataset" (rows of data.dataset; set for you
    # when data.dataset is given and data.task is left at its default)
    task: str = "arithmetic"
    path: Optional[str] = None  # for task: jsonl, a local .jsonl file with a prompt column
    prompt_column: str = "prompt"
    num_train: int = 2000
    num_eval: int = 200
    seed: int = 0
    chat_template: Literal["auto", "always", "never"] = "auto"
    system_prompt: Optional[str] = None
    task_args: dict = field(default_factory=dict)  # passed to the task's builder
    # A hub id (openai/gsm8k) or a local .jsonl/.json/.parquet/.csv file or folder (a save_to_disk folder
    # too), loaded through `datasets` (pip install 'tinyrl-rlvr[data]'); HF_HUB_OFFLINE=1 reads the cache
    dataset: Optional[str] = None
    config: Optional[str] = None  # the dataset's configuration (subset), e.g. main
    split: str = "train"
    eval_split: Optional[str] = None  # the held-out split; null: a seeded eval_fraction of `split`
    eval_fraction: float = 0.05  # share of `split` held out when there is no eval_split (0 with num_eval 0)
    columns: dict = field(default_factory=dict)  # {prompt: <column>, answer: <column>} of the dataset
    prompt_template: Optional[str] = None  # the prompt as a format string over a row's columns: "{question}"
    # how the gold answer is read from the answer column: gsm8k `#### n`, the last \boxed{}, the plain value,
    # or auto (#### else \boxed{} else plain); tinyrl.tasks.dataset.ANSWER_EXTRACTORS
    answer_extractor: Literal["auto", "gsm8k", "boxed", "plain"] = "auto"
    # several sources interleaved by weight (datasets.interleave_datasets, seeded by data.seed), each with its own
    # dataset / split / columns / prompt_template / answer_extractor (tinyrl/config/schema_data.py: MixSource);
    # mix_stopping: first_exhausted ends the mixture when one source runs out, all_exhausted when every one has
    mix: list[MixSource] = field(default_factory=list)
    mix_stopping: Literal["first_exhausted", "all_exhausted"] = "first_exhausted"
    filter: DataFilter = field(default_factory=DataFilter)  # rows dropped before training ({max_prompt_tokens: N})

    def __post_init__(self):
        if (self.dataset is not None or self.mix) and self.task == "arithmetic":  # the default task: these mean rows
            self.task = "dataset"

    def validate(self, p: str) -> None:
        if self.task == "jsonl":
            check(self.path is not None, f"{p}.path", "is required when data.task is 'jsonl'")
            check(not Path(self.path).is_dir(), f"{p}.path", f"{self.path} is a folder; give the .jsonl file in it")
            check_local(self.path, f"{p}.path", "file")
        check(self.num_train >= 1, f"{p}.num_train", f"must be >= 1, got {self.num_train}")
        check(self.num_eval >= 0, f"{p}.num_eval", f"must be >= 0, got {self.num_eval}")
        self._validate_dataset(p)

    def _validate_dataset(self, p: str) -> None:
        ds = self.dataset
        check_mix(self, p)
        check(self.task != "dataset" or bool(ds) or bool(self.mix), f"{p}.dataset",
              "is required when data.task is 'dataset' (a hub id like openai/gsm8k, or a local file or folder; "
              "or several sources in data.mix)")
        check(ds is None or self.task == "dataset", f"{p}.dataset",
              f"gives the rows of data.task 'dataset', not of the {self.task!r} task (whose data is set in "
              f"data.task_args); leave data.task at its default or set it to 'dataset'")
        if ds is not None:
            local = ds.startswith((".", "/", "~")) or Path(ds).suffix.lower() in DATA_FILE_SUFFIXES
            if local:
                check_local(ds, f"{p}.dataset", hint=" (a hub id is 'owner/name')")
        check_columns(self.columns, f"{p}.columns")
        check_split_spec(self.split, f"{p}.split")  # a split or datasets' slices of splits: train[:10%]
        if self.eval_split is not None:
            check_split_spec(self.eval_split, f"{p}.eval_split")
        check(0 <= self.eval_fraction < 1, f"{p}.eval_fraction", f"must be in [0, 1), got {self.eval_fraction}")
        if self.prompt_template is not None:
            check_template(self.prompt_template, f"{p}.prompt_template")


@dataclass
class RewardSpec:
    SHORTHAND = "name"  # `- task` in a preset is `- {name: task}`

    name: str  # a registry name (tinyrl.rewards.REWARDS) or "package.module:function"
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)  # bound to the function before the call


@dataclass
class RewardConfig:
    functions: list[RewardSpec] = field(default_factory=lambda: [RewardSpec("task")])
    combine: Literal["sum", "normalize_then_sum", "sum_then_normalize"] = "sum"
    # Seconds one call of one reward function may take (a call scores a whole batch); past it, the
    # call's samples score None (excluded) and the call is counted. null: no limit.
    timeout: Optional[float] = 300.0
    # Call the rewards in a process of their own, forked from the trainer once per run, so that
    # os._exit, a segfault in a native extension or a runaway allocation ends the reward call (its
    # samples excluded and counted), not the run; a call past the timeout is killed there. false: in
    # the trainer's process (a reward that runs a model on the CUDA card, which a fork cannot share;
    # with timeout null it then runs on the main thread, e.g. for rewards that install signal handlers).
    isolate: bool = True

    def validate(self, p: str) -> None:
        check(len(self.functions) >= 1, f"{p}.functions", "needs at least one reward function")
        for i, spec in enumerate(self.functions):
            check(math.isfinite(spec.weight), f"{p}.functions[{i}].weight", f"must be a finite number, got {spec.weight}")
        t = self.timeout
        check(t is None or 0 < t < math.inf, f"{p}.timeout", f"must be > 0 seconds (or null: no timeout), got {t}")


@dataclass
class TrainConfig:
    LIMITS = {"steps": (0, 10_000_000), "prompts_per_step": (1, 65536), "micro_batch_size": (1, 65536),
              "warmup_steps": (0, 10_000_000), "seed": (0, 2**32 - 1), "save_every": (0, 10_000_000),
              "keep_last": (1, 1000), "eval_samples": (0, 1024), "stop_timeout_s": (1, 86400)}

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
    # with eval_before_after: also sample this many completions per held-out prompt and report pass@k and
    # maj@k (tinyrl/passk.py) before and after training; 0: off. eval_k: the k ([]: 1, 2, 4, ... up to
    # eval_samples); eval_temperature: their temperature (null: rollout.temperature)
    eval_samples: int = 0
    eval_k: list[int] = field(default_factory=list)
    eval_temperature: Optional[float] = None
    # A run whose planned peak memory (the plan `tinyrl plan` prints) is above this device's memory is
    # refused at start, naming the fields to lower and the largest values that fit. true: start it anyway
    # (for a planner that overestimates your case; the run may then end in an out-of-memory error).
    ignore_memory_plan: bool = False
    # Ctrl-C / SIGTERM inside a step lets the step finish, for at most this long; then the step is abandoned
    # (the last checkpoint is kept) and the process stops
    stop_timeout_s: float = 300.0
    # true: the run repeats exactly on a CPU (same seed, same metrics.jsonl): one intra-op thread and torch's
    # deterministic algorithms (multi-threaded reductions add in an order that varies run to run); it gives up
    # the other cores (README, "Runs that repeat": what it cost)
    deterministic: bool = False

    def validate(self, p: str) -> None:
        check(self.steps >= 0, f"{p}.steps", f"must be >= 0, got {self.steps}")
        check(self.prompts_per_step >= 1, f"{p}.prompts_per_step", f"must be >= 1, got {self.prompts_per_step}")
        check(self.micro_batch_size >= 1, f"{p}.micro_batch_size", f"must be >= 1, got {self.micro_batch_size}")
        check(0 < self.lr < math.inf, f"{p}.lr", f"must be > 0 and finite, got {self.lr}")
        check(0 <= self.weight_decay < math.inf, f"{p}.weight_decay", f"must be >= 0 and finite, got {self.weight_decay}")
        check(self.max_grad_norm > 0, f"{p}.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        check(self.warmup_steps >= 0, f"{p}.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        check(self.save_every >= 0, f"{p}.save_every", f"must be >= 0, got {self.save_every}")
        check(self.keep_last >= 1, f"{p}.keep_last", f"must be >= 1, got {self.keep_last}")
        check(self.eval_samples >= 0, f"{p}.eval_samples", f"must be >= 0 (0: off), got {self.eval_samples}")
        check(all(k >= 1 for k in self.eval_k), f"{p}.eval_k", f"every k must be >= 1, got {self.eval_k}")
        if self.eval_samples:
            k = max(self.eval_k, default=1)
            check(k <= self.eval_samples, f"{p}.eval_k", f"k={k} needs {p}.eval_samples >= {k} (k <= samples), "
                  f"got eval_samples={self.eval_samples}")
            check(self.eval_before_after, f"{p}.eval_samples",
                  f"pass@k runs with the held-out evaluation: set {p}.eval_before_after=true, or eval_samples=0")
        t = self.eval_temperature
        check(t is None or 0 < t < math.inf, f"{p}.eval_temperature", f"must be > 0 and finite, or null, got {t}")


@dataclass
class LogConfig:
    LIMITS = {"samples_per_step": (0, 10_000), "samples_every": (0, 10_000_000), "hub_timeout_s": (0, 86_400)}

    run_dir: str = "runs"
    name: Optional[str] = None  # run folder name; default: preset name + timestamp
    samples_per_step: int = 4  # completions written to samples.jsonl each step
    progress: bool = True
    track_likelihood: bool = True  # re-score the batch after the update: policy KL, update clip frac, LLD
    # experiment trackers to send step metrics, the config, alarms, sample tables and held-out results to
    # (tinyrl/trackers): trackio, wandb, tensorboard (one name alone: a list of it); empty: none (none is imported)
    report_to: Union[list[str], str] = field(default_factory=list)
    samples_every: int = 10  # a table of the step's samples to the trackers every this many steps; 0: never
    tracker_project: Optional[str] = None  # the trackers' project name; null: "tinyrl"
    # push the adapter and its model card to this hub repo (USER/NAME) while training, on a background thread that
    # never blocks or fails the run (tinyrl/hub_sync.py); hub_strategy as TRL's: end (the last save only), every_save
    # (each checkpoint save), checkpoint (each save, plus last-checkpoint/: `tinyrl train --resume hub:USER/NAME`)
    push_to_hub: Optional[str] = None
    hub_strategy: Literal["end", "every_save", "checkpoint"] = "every_save"
    hub_private: bool = False  # create the repo private
    hub_timeout_s: float = 300.0  # at the end, wait at most this long for the last push (0: do not wait)

    def __post_init__(self):
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]

    def validate(self, p: str) -> None:
        check(self.samples_per_step >= 0, f"{p}.samples_per_step", f"must be >= 0, got {self.samples_per_step}")
        check(self.samples_every >= 0, f"{p}.samples_every", f"must be >= 0 (0: no sample tables), got {self.samples_every}")
        for i, name in enumerate(self.report_to):
            check(name in TRACKERS, f"{p}.report_to[{i}]", f"must be one of {sorted(TRACKERS)}, got {name!r}")
        check(len(set(self.report_to)) == len(self.report_to), f"{p}.report_to", f"names a tracker twice: {self.report_to}")
        check(self.tracker_project is None or bool(self.tracker_project.strip()), f"{p}.tracker_project",
              "must be a non-empty name or null")
        repo = self.push_to_hub
        check(repo is None or (len(repo) <= 96 and bool(HUB_REPO_ID.match(repo)) and ".." not in repo), f"{p}.push_to_hub",
              f"a hub repo id is USER/NAME or ORG/NAME (letters, digits, '-', '_', '.'), got {repo!r:.120}")
        name = self.name
        if name is not None:
            check(inside_run_dir(name), f"{p}.name",
                   f"must be a folder name inside log.run_dir (not '.', no '..', no absolute path), got {name!r}")


HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # tinyrl.hub_push's rule for a repo id


def inside_run_dir(name: str) -> bool:
    """Whether `name` names a folder strictly inside log.run_dir: not empty, not absolute, no '..', and
    not '.' (or './.'), which Path reduces to no part at all: the run_dir itself.

    >>> [inside_run_dir(n) for n in ("a", "a/b", "./a", ".", "./.", "", "../a", "/a")]
    [True, True, True, False, False, False, False, False]
    """
    parts = Path(name).parts
    return bool(name.strip()) and bool(parts) and not Path(name).is_absolute() and ".." not in parts \
        and "\\" not in name


@dataclass
class DistConfig:
    """Scale-out (tinyrl.distributed). `nproc` > 1 makes `tinyrl train` re-launch itself through
    `accelerate launch` with the packaged `accelerate_config`; under a launcher the world size is the
    launcher's. train.prompts_per_step is the global batch: it must divide by the process count."""

    LIMITS = {"nproc": (1, 4096), "timeout_s": (0, 7 * 86400)}

    nproc: int = 1  # processes (one per GPU); 1 = this process only
    accelerate_config: Literal["ddp", "zero3", "fsdp2"] = "ddp"  # tinyrl/assets/accelerate/<name>.yaml
    timeout_s: float = 600.0  # the longest any process waits for another (a dead or stalled rank)

    def validate(self, p: str) -> None:
        check(self.nproc >= 1, f"{p}.nproc", f"must be >= 1, got {self.nproc}")
        check(0 < self.timeout_s < math.inf, f"{p}.timeout_s", f"must be > 0 and finite, got {self.timeout_s}")


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
    # methods run in order, each starting from the previous one's adapter (tinyrl/methods/chain.py),
    # e.g. [sft, grpo]: a cold start then GRPO; empty: GRPO alone
    stages: list[str] = field(default_factory=list)

    def validate(self, p: str = "") -> None:
        B, g = self.train.prompts_per_step, self.rollout.inflight_groups
        check(g is None or g <= 8 * B, "rollout.inflight_groups",
              f"at most 8 x train.prompts_per_step = {8 * B} groups in flight (each holds its decoding state), got {g}")
        completions = self.train.prompts_per_step * self.rollout.num_generations
        check(completions <= 1 << 20, "rollout.num_generations",
              f"train.prompts_per_step x rollout.num_generations = {completions} completions a step; at most {1 << 20}")
        check(
            completions % self.train.micro_batch_size == 0,
            "train.micro_batch_size",
            f"must divide train.prompts_per_step * rollout.num_generations = {completions}, got {self.train.micro_batch_size}",
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

