"""What every method shares, so the methods cannot drift apart:

- `open_run`: the run folder, created fresh (rank 0) or continued (locked, an interrupted save
  recovered, the changed-config warning, a resumes.jsonl record);
- the one run assembly: `load_model` (seeded, on this process's device, one adapter on every rank),
  `build_run` (model, tokenizer, engine, rows rendered as the run's engine sees them, rewards, sampling),
  which every method, `tinyrl.evaluate` and the held-out evaluation use; its pieces `sampling_params`,
  `reward_set`, `task_rows`, `HeldOut` (greedy pass@1);
- `Summary` / `write_summary`: the one summary.json schema, written by rank 0 only.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

import torch
import yaml

from tinyrl import distributed
from tinyrl.config import Resolved, config_changes
from tinyrl.data import filter_rows, load_rows
from tinyrl.distributed import Dist
from tinyrl.errors import ConfigError
from tinyrl.evaluation import accuracy
from tinyrl.model import load_policy
from tinyrl.report import write_report
from tinyrl.rewards.core import RewardSet
from tinyrl.rollout.base import SamplingParams
from tinyrl.rollout.engines import make_engine, prompt_renderer
from tinyrl.runs import RunDir, atomic_write_text, read_jsonl
from tinyrl.trainer import TrainerParts

log = logging.getLogger("tinyrl")
SUMMARY_FILE = "summary.json"


# --------------------------------------------------------------------------- the run folder


def open_run(resolved: Resolved) -> RunDir:
    """The run folder `resolved` names, locked for this process: a fresh one (rank 0 creates it and
    writes config.yaml; other ranks read it), or the one to resume."""
    cfg = resolved.cfg
    dist = distributed.setup(cfg.dist.timeout_s)
    if resolved.resume is None:
        made = {}

        def create() -> str:
            made["run"] = RunDir.create(cfg.log.run_dir, resolved.name, resolved.written)
            return str(made["run"].path)

        path = dist.main_value(create)
        return made.get("run") or distributed.replica_run_dir(path)
    path = resolved.resume
    run = RunDir(path) if dist.is_main else distributed.replica_run_dir(path)  # rank 0 owns the folder
    run.lock()
    try:
        for note in run.recover():
            log.warning("resume %s: %s", path, note)
        dist.barrier()  # the others read the folder once rank 0 has finished an interrupted save
        # both sides as written (config.yaml): an `auto` the run decided, or a monitor action it took
        # (kept in its checkpoints), is not a change the user made
        changed = config_changes(run.config(), resolved.written)
        if changed:
            log.warning("--resume: the config differs from the one this run last started with: %s",
                        "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()))
        if dist.is_main:
            atomic_write_text(run.path / "config.yaml", yaml.safe_dump(resolved.written, sort_keys=False))
            record = run.writer("resumes.jsonl")
            record.write({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "overrides": resolved.overrides,
                          "changed": {k: list(v) for k, v in changed.items()}, "processes": dist.world})
            record.close()
    except BaseException:
        run.unlock()
        raise
    return run


def note_resume(run: RunDir, **fields) -> None:
    """Add what the method continued from (its checkpoint, its step) to this resume's resumes.jsonl record."""
    path = run.path / "resumes.jsonl"
    rows = read_jsonl(path) if distributed.setup().is_main and path.exists() else []
    if rows:
        rows[-1].update(fields)
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


# --------------------------------------------------------------------------- summary.json


@dataclass
class Summary:
    """summary.json, the same keys for every method; what only one method measures goes in `details`."""

    method: str  # grpo | sft | rest_em | star | chain
    steps: int = 0  # optimiser steps (grpo, sft), iterations (rest_em, star), every stage's (chain)
    eval_before: float | None = None  # held-out greedy pass@1 before training (None: not measured)
    eval_after: float | None = None
    interrupted: bool = False  # stopped by a signal, with a checkpoint to resume from (else `error` says why not)
    error: str | None = None  # what stopped the run, when something did
    alarms: list[str] = field(default_factory=list)  # monitor alarms that fired (names)
    reward_failures: dict[str, int] = field(default_factory=dict)  # samples a reward function failed on
    details: dict = field(default_factory=dict)


def write_summary(run: RunDir, summary: Summary) -> None:
    """summary.json and report.txt, from rank 0 only (the others' run folders write nothing). A full disk
    must not hide the error that stopped the run: it is logged, not raised."""
    if not distributed.setup().is_main:
        return
    try:
        atomic_write_text(run.path / SUMMARY_FILE, json.dumps(asdict(summary), indent=2))
        write_report(run.path)
    except OSError as e:
        log.warning("could not write the run summary: %s", e)


def read_summary(run: RunDir) -> dict:
    path = run.path / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------- the run assembly


def make_deterministic() -> None:
    """train.deterministic: one intra-op thread (a multi-threaded CPU reduction adds its partial sums in an order
    that depends on scheduling, so two runs drift apart after some steps) and torch's deterministic kernels."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)


def load_model(cfg, dist: Dist, adapter: str | None = None):
    """(peft model, tokenizer): the base with LoRA, from `adapter` (else model.adapter, else a fresh one seeded
    by train.seed), on this process's device (4-bit weights are placed at load), the same adapter on every rank."""
    if cfg.train.deterministic:
        make_deterministic()
    torch.manual_seed(cfg.train.seed)  # the LoRA init
    model, tokenizer = load_policy(cfg.model, cfg.lora, adapter=adapter or cfg.model.adapter)
    if not getattr(model, "is_loaded_in_4bit", False):
        model.to(dist.device)
    dist.broadcast_params([p for p in model.parameters() if p.requires_grad])  # [dist] one adapter
    return model, tokenizer


def build_run(cfg, dist: Dist, adapter: str | None = None, train: bool = True,
              engine: str | None = None) -> TrainerParts:
    """Everything a run trains or evaluates with: the rows first (a data error ends it before the model loads),
    the model (`load_model`), the engine (`engine`, default rollout.engine; with the run's agent), the rows
    rendered as that engine sees them (`train=False`: the held-out rows only), the rewards and sampling."""
    train_rows, eval_rows, task = load_rows(cfg.data)
    if task is not None and not eval_rows and (cfg.train.eval_before_after or not train):
        raise ConfigError(f"train.eval_before_after: the held-out set of data.task {cfg.data.task!r} is empty (too few "
                          "rows to hold any out?): hold some out (data.num_eval, data.eval_fraction, data.eval_split), "
                          "or set train.eval_before_after: false")
    train_rows = train_rows if train else []
    model, tokenizer = load_model(cfg, dist, adapter)
    rollout = make_engine(engine or cfg.rollout.engine, model, tokenizer, cfg, seed=cfg.train.seed, task=task)
    render_rows(train_rows + eval_rows, prompt_renderer(cfg, tokenizer, task, rollout))
    train_rows, eval_rows = filter_rows(train_rows, eval_rows, tokenizer, cfg.data)  # data.filter: before training
    return TrainerParts(model, tokenizer, rollout, task, train_rows, eval_rows, reward_set(cfg, task),
                        sampling_params(cfg, task))


# --------------------------------------------------------------------------- the pieces of a run


def sampling_params(cfg, task) -> SamplingParams:
    """The rollout's sampling settings; stop strings from rollout.stop, else the task's own."""
    r = cfg.rollout
    return SamplingParams(r.temperature, r.top_p, r.max_new_tokens, list(r.stop) or (task.stop if task else []))


def reward_set(cfg, task) -> RewardSet:
    return RewardSet(cfg.reward.functions, task, cfg.reward.combine, timeout=cfg.reward.timeout,
                     isolate=cfg.reward.isolate)


def task_rows(cfg, tokenizer, engine=None, train: bool = True):
    """(train rows, held-out rows, task), each row's `rendered` prompt as the run's engine sees it
    (`engine`: the run's, when it has one already); `train=False` renders the held-out rows only."""
    train_rows, held_out, task = load_rows(cfg.data)
    render_rows((train_rows if train else []) + held_out, prompt_renderer(cfg, tokenizer, task, engine))
    return train_rows, held_out, task


def render_rows(rows: list[dict], render) -> None:
    """Each row's `rendered` prompt: `render(row["prompt"])`."""
    for r in rows:
        r["rendered"] = render(r["prompt"])


class HeldOut:
    """Held-out greedy pass@1 of a model, through the run's rollout engine (multi-turn for an agent
    preset); None where the run has no task, no held-out rows, or train.eval_before_after is off."""

    def __init__(self, cfg, tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        _, self.rows, self.task = task_rows(cfg, tokenizer, train=False)
        self.params = sampling_params(cfg, self.task)

    def __call__(self, model) -> float | None:
        c = self.cfg
        if not (c.train.eval_before_after and self.task and self.rows):
            return None
        engine = make_engine(c.rollout.engine, model, self.tokenizer, c, seed=c.train.seed, task=self.task)
        try:
            return accuracy(engine, self.rows, self.task, self.params)
        finally:
            engine.release()
