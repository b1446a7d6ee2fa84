"""Supervised fine-tuning (LoRA / QLoRA) through TRL's `SFTTrainer`: `tinyrl sft` and the `sft` stage.

    tinyrl sft tiny_sft_cpu                      # the task's true answers for its train prompts
    tinyrl sft tiny_sft_cpu data=rows.jsonl      # prompt/completion rows
    tinyrl sft tiny_sft_cpu data=runs/some-run sft.min_reward=1.0   # a run folder's correct samples
    sft: {data: demonstrations}   # an agent task's expert trajectories (tinyrl.agents.demonstrations)

Rows come from `sft.data` (see `load_rows`): a jsonl file of prompt/completion rows, a run
folder's samples.jsonl filtered by reward, the task's own train rows, or (agent presets) the
task's expert demonstrations replayed through the run's tools. The model comes
from `tinyrl.model.load_policy` (built-in offline names, 4-bit nf4, LoRA; `model.adapter`
continues a trained adapter) and TRL trains it: its optimiser, schedule, checkpoints and
resume (`resume_from_checkpoint`), with `completion_only_loss` building labels that are
-100 on every prompt token.

Rows are tokenized here, the way the rollout engine sees them: the prompt rendered as at
rollout (`tinyrl.rollout.prompt_renderer`: the chat template, plus an agent format's
instructions and tools) and encoded alone without special tokens, the completion encoded
alone and closed with EOS. So no token merges across the prompt / completion boundary and the
GRPO stage that follows samples from exactly the context SFT trained on. TRL gets
`input_ids` + `completion_mask` (its processed-dataset path); a demonstration's tool
observations are 0 in `completion_mask`, as they are in the GRPO loss mask: the model learns
its own turns, never the tool's text.

The run folder is tinyrl's: config.yaml, metrics.jsonl (a row per logging step, `step` =
optimiser step), checkpoints/checkpoint-N (TRL's own), adapter/, summary.json (eval_before /
eval_after: held-out greedy pass@1 when the run has a task).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from tinyrl.agents.demonstrations import DEMONSTRATIONS
from tinyrl.errors import ConfigError
from tinyrl.runs import RunDir, atomic_write_text, read_jsonl, truncate_jsonl

log = logging.getLogger("tinyrl.sft")

CKPT_PREFIX = "checkpoint-"  # TRL / transformers checkpoint folders


def _require_trl():
    try:
        import trl  # noqa: F401
    except ImportError as e:
        raise ConfigError("stages: SFT (the sft, rest_em and star stages) runs on TRL, which is not installed: "
                          "pip install 'tinyrl[sft]'") from e


# --------------------------------------------------------------------------- rows


def load_rows(cfg) -> list[dict]:
    """The SFT rows `cfg.sft` names: dicts with `completion` and `prompt` (raw) or `rendered`.

    - a jsonl file: its `prompt_column` / `completion_column` ("completion"); rows with a
      `reward` below `min_reward` (when set) are dropped;
    - a run folder: its samples.jsonl rows whose `reward` >= `min_reward` (their prompts are
      already rendered as the run's engine saw them);
    - null: the task's train rows (`data.*`), completion from `completion_column` ("answer");
    - "demonstrations": the task's expert steps for its train rows (`Task.demonstrate`), each row
      {"prompt", "steps", "row"}: `tokenize` replays them through the agent's tools.
    """
    s = cfg.sft
    if s.data == DEMONSTRATIONS:
        return cap_per_prompt(demonstration_rows(cfg), s.max_per_prompt)
    if s.data is None:
        from tinyrl.data import load_rows as task_rows

        column = s.completion_column or "answer"
        train, _, _ = task_rows(cfg.data)
        missing = [i for i, r in enumerate(train) if column not in r]
        if missing:
            raise ConfigError(f"sft.completion_column: train row {missing[0]} of data.task {cfg.data.task!r} "
                             f"has no {column!r} column to learn (columns: {sorted(train[missing[0]])})")
        rows = [{"prompt": r["prompt"], "completion": str(r[column])} for r in train]
    elif Path(s.data).is_dir():
        rows = [{"rendered": r["rendered"] if "rendered" in r else r["prompt"], "completion": r["completion"],
                 "reward": r.get("reward")} for r in read_jsonl(Path(s.data) / "samples.jsonl")]
    else:
        rows = _file_rows(Path(s.data), s.prompt_column, s.completion_column or "completion")
    return cap_per_prompt(filter_reward(rows, s.min_reward), s.max_per_prompt)


def demonstration_rows(cfg) -> list[dict]:
    """The task's expert steps for each train row it can demonstrate (ConfigError when it has none)."""
    from tinyrl.data import load_rows as task_rows

    agent = getattr(cfg, "agent", None)
    if agent is None or not agent.enabled:
        raise ConfigError("sft.data: demonstrations are agent trajectories; they need agent.enabled: true "
                          "(and an agent task, e.g. data.task: search_qa)")
    train, _, task = task_rows(cfg.data)
    if task is None or task.demonstrate is None:
        raise ConfigError(f"sft.data: the {cfg.data.task!r} task has no expert demonstrations "
                          f"(tasks that have them: search_qa); give a jsonl file or a run folder instead")
    rows = [{"prompt": r["prompt"], "steps": steps, "row": r} for r in train if (steps := task.demonstrate(r))]
    if not rows:
        raise ConfigError(f"sft.data: the {cfg.data.task!r} task could demonstrate none of its {len(train)} train rows "
                          f"(its demonstrations know the shipped world's questions only)")
    return rows


def _file_rows(path: Path, prompt_col: str, completion_col: str) -> list[dict]:
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        r = json.loads(line)
        for col in (prompt_col, completion_col):
            if col not in r:
                raise ConfigError(f"sft.data: row {i} of {path} has no {col!r} column (columns: {sorted(r)})")
        rows.append({"prompt": r[prompt_col], "completion": r[completion_col], "reward": r.get("reward")})
    return rows


def filter_reward(rows: list[dict], min_reward: float | None) -> list[dict]:
    """Rows whose `reward` is >= min_reward (None keeps all; a row without a reward fails a threshold).

    >>> filter_reward([{"reward": 1.0}, {"reward": 0.0}, {"reward": None}], 1.0)
    [{'reward': 1.0}]
    """
    if min_reward is None:
        return rows
    return [r for r in rows if isinstance(r.get("reward"), (int, float)) and r["reward"] >= min_reward]


def cap_per_prompt(rows: list[dict], cap: int | None) -> list[dict]:
    """At most `cap` rows per prompt, distinct completions first, in their order.

    >>> rows = [{"prompt": "p", "completion": c} for c in ["a", "a", "b", "c"]]
    >>> [r["completion"] for r in cap_per_prompt(rows, 2)], len(cap_per_prompt(rows, None))
    (['a', 'b'], 4)
    """
    if cap is None:
        return rows
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        by_prompt.setdefault(r.get("rendered", r.get("prompt")), []).append(r)
    out = []
    for group in by_prompt.values():
        seen, firsts, repeats = set(), [], []
        for r in group:
            (repeats if r["completion"] in seen else firsts).append(r)
            seen.add(r["completion"])
        out.extend((firsts + repeats)[:cap])
    return out


def tokenize(rows: list[dict], tokenizer, cfg_data, agent=None, budget: int | None = None):
    """A `datasets.Dataset` of `input_ids` + `completion_mask` (1 on completion tokens and EOS).

    `agent` (an `AgentEngine`; `agent_for` builds the run's) renders prompts with its format's
    instructions and replays demonstration rows (`steps`) through its tools: their observation
    tokens get 0. A demonstration longer than `budget` (rollout.max_new_tokens) is dropped, with
    a warning: no rollout could produce it."""
    from datasets import Dataset

    from tinyrl.data import render_prompt

    render = (lambda text: agent.render(text, cfg_data)) if agent is not None else (
        lambda text: render_prompt(tokenizer, text, cfg_data))
    eos = tokenizer.eos_token_id
    out = {"input_ids": [], "completion_mask": []}
    too_long = 0
    for r in rows:
        rendered = r["rendered"] if "rendered" in r else render(r["prompt"])
        p = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        if "steps" in r:
            if agent is None:
                raise ConfigError("sft.data: demonstrations are agent trajectories; they need agent.enabled: true")
            replayed = agent.replay(p, r["row"], r["steps"], budget or 1 << 30)
            if replayed is None:
                too_long += 1
                continue
            c, obs = replayed
            mask = [1 - o for o in obs]
        else:
            c = tokenizer(r["completion"], add_special_tokens=False)["input_ids"]
            if not c or c[-1] != eos:
                c = c + [eos]  # the completion ends where the engine stops: EOS
            mask = [1] * len(c)
        out["input_ids"].append(p + c)
        out["completion_mask"].append([0] * len(p) + mask)
    if too_long:
        log.warning("sft: %d of %d demonstrations are longer than rollout.max_new_tokens=%s and were dropped",
                    too_long, len(rows), budget)
    if not out["input_ids"]:
        raise ConfigError(f"sft.data: every demonstration is longer than rollout.max_new_tokens={budget}; raise it")
    return Dataset.from_dict(out)


def agent_for(cfg, tokenizer, task=None):
    """The run's `AgentEngine` for rendering and replay (no sampling engine under it), or None
    when the preset has no agent."""
    agent = getattr(cfg, "agent", None)
    if agent is None or not agent.enabled:
        return None
    from tinyrl.data import load_rows as task_rows
    from tinyrl.rollout.agent import AgentEngine

    if task is None:
        task = task_rows(cfg.data)[2]
    return AgentEngine.from_config(None, tokenizer, agent, task)


# --------------------------------------------------------------------------- TRL


def trl_args(cfg, output_dir: Path, num_rows: int):
    """TRL's SFTConfig from tinyrl's sections: `sft` (its own switches) and `train`/`model`/`log`."""
    import torch
    from trl import SFTConfig as TRLSFTConfig

    s = cfg.sft
    steps_per_epoch = math.ceil(num_rows / (s.batch_size * s.grad_accum))
    with warnings.catch_warnings():  # transformers 5 renames it activation_checkpointing; TRL reads this name
        warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated", FutureWarning)
        return _trl_config(TRLSFTConfig, cfg, s, output_dir, steps_per_epoch, torch.cuda.is_available())


def _trl_config(TRLSFTConfig, cfg, s, output_dir, steps_per_epoch, cuda):
    from tinyrl.model import checkpointing_on

    return TRLSFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=s.epochs,
        max_steps=s.max_steps if s.max_steps is not None else -1,
        learning_rate=s.lr,
        lr_scheduler_type=s.scheduler,
        warmup_steps=round(s.warmup_ratio * (s.max_steps or steps_per_epoch * s.epochs)),
        per_device_train_batch_size=s.batch_size,
        gradient_accumulation_steps=s.grad_accum,
        max_length=s.max_length,
        completion_only_loss=s.completion_only_loss,
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        seed=cfg.train.seed,
        logging_steps=s.logging_steps,
        save_strategy="steps" if s.save_every else "no",
        save_steps=s.save_every or 500,
        save_total_limit=cfg.train.keep_last,
        gradient_checkpointing=checkpointing_on(cfg.model),
        bf16=cfg.model.dtype == "bfloat16",
        fp16=cfg.model.dtype == "float16",
        use_cpu=not cuda,
        disable_tqdm=not cfg.log.progress,
        report_to="none",
        dataloader_num_workers=0,
    )


class MetricsCallback:
    """Writes TRL's training logs to metrics.jsonl: one row per logging step, `step` = optimiser step.

    TRL's `learning_rate` is written as `lr` (the GRPO trainer's name for it); the last log
    (train_runtime, train_loss) is kept in `final` for summary.json, not written as a row."""

    def __init__(self, path: Path):
        self.path = path
        self.final: dict = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "train_runtime" in logs:
            self.final = logs
            return
        if "loss" not in logs:
            return
        if "learning_rate" in logs:
            logs["lr"] = logs.pop("learning_rate")
        row = {"step": state.global_step, **{k: v for k, v in logs.items() if _finite(v)}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _finite(v) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


class StopOnSignal:
    """SIGINT / SIGTERM end the run at the next optimiser step with a checkpoint (TRL saves it).

    A second Ctrl-C interrupts at once (the previous handler is back after the first)."""

    def __init__(self):
        self.stopped = False
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum, frame):
        self.stopped = True
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopped:
            control.should_save = True
            control.should_training_stop = True
        return control


class Progress:
    """A tqdm bar over optimiser steps with the loss (like the GRPO trainer's), no log dicts printed."""

    bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="sft", unit="step", dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{logs['loss']:.4g}")

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()


def _as_callbacks(*objs):
    """Plain objects with `on_*` methods as transformers TrainerCallbacks."""
    from transformers import TrainerCallback

    out = []
    for obj in objs:
        cb = type(f"{type(obj).__name__}Callback", (TrainerCallback,), {})()
        for name in ("on_train_begin", "on_log", "on_step_end", "on_train_end"):
            if hasattr(obj, name):
                setattr(cb, name, getattr(obj, name))
        out.append(cb)
    return out


def make_trainer(cfg, model, tokenizer, dataset, output_dir: Path, callbacks=()):
    """TRL's SFTTrainer over a tokenized dataset (see `tokenize`), checkpointing into `output_dir`."""
    _require_trl()
    from trl import SFTTrainer

    import datasets
    from transformers import PrinterCallback, ProgressCallback

    datasets.disable_progress_bars()  # TRL's dataset preparation bars; tinyrl draws its own progress
    args = trl_args(cfg, output_dir, len(dataset))
    progress = [Progress()] if cfg.log.progress else []
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=_as_callbacks(*callbacks, *progress))
    for cb in (PrinterCallback, ProgressCallback):  # they print every log dict
        trainer.remove_callback(cb)
    return trainer


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete TRL checkpoint in `folder` (one whose trainer_state.json was written last)."""
    if not folder.is_dir():
        return None
    done = [p for p in folder.iterdir() if p.name.startswith(CKPT_PREFIX) and (p / "trainer_state.json").is_file()
            and p.name[len(CKPT_PREFIX):].isdigit()]
    return max(done, key=lambda p: int(p.name[len(CKPT_PREFIX):]), default=None)


def save_adapter(model, dest: Path) -> Path:
    """Save the peft adapter into `dest` atomically (a tmp folder renamed into place)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


@dataclass
class FitResult:
    adapter: Path | None  # None when interrupted (a checkpoint holds the progress)
    steps: int
    train_loss: float | None
    interrupted: bool


def fit(cfg, model, tokenizer, rows: list[dict], folder: Path) -> FitResult:
    """SFT `model` on `rows` in `folder` (metrics.jsonl, checkpoints/, adapter/); resumes from the
    newest checkpoint there. The one SFT routine: `tinyrl sft`, the sft stage and ReST-EM's M-step."""
    folder.mkdir(parents=True, exist_ok=True)
    ckpt_dir = folder / "checkpoints"
    resume = last_checkpoint(ckpt_dir)
    truncate_jsonl(folder / "metrics.jsonl", _ckpt_step(resume))  # drop rows past the checkpoint
    metrics = MetricsCallback(folder / "metrics.jsonl")
    with StopOnSignal() as stop:
        dataset = tokenize(rows, tokenizer, cfg.data, agent_for(cfg, tokenizer), cfg.rollout.max_new_tokens)
        trainer = make_trainer(cfg, model, tokenizer, dataset, ckpt_dir, [metrics, stop])
        if resume is not None:
            log.info("sft: resuming from %s", resume)
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    steps = trainer.state.global_step
    if stop.stopped:
        return FitResult(None, steps, None, True)
    return FitResult(save_adapter(model, folder / "adapter"), steps, metrics.final.get("train_loss"), False)


def _ckpt_step(ckpt: Path | None) -> int:
    return int(ckpt.name[len(CKPT_PREFIX):]) if ckpt is not None else 0


# --------------------------------------------------------------------------- held-out accuracy


class HeldOut:
    """Held-out greedy pass@1 of the run's task (None without a task or held-out rows)."""

    def __init__(self, cfg, tokenizer):
        from tinyrl.data import load_rows as task_rows
        from tinyrl.data import render_prompt
        from tinyrl.rollout.base import SamplingParams

        self.cfg = cfg
        _, self.rows, self.task = task_rows(cfg.data)
        agent = agent_for(cfg, tokenizer, self.task)  # an agent preset's prompts carry its format's instructions
        for r in self.rows:
            r["rendered"] = agent.render(r["prompt"], cfg.data) if agent else render_prompt(tokenizer, r["prompt"], cfg.data)
        stop = list(cfg.rollout.stop) or (self.task.stop if self.task else [])
        r = cfg.rollout
        self.params = SamplingParams(r.temperature, r.top_p, r.max_new_tokens, stop)

    def __call__(self, model, tokenizer) -> float | None:
        from tinyrl.evaluation import accuracy
        from tinyrl.rollout import make_engine

        if not (self.cfg.train.eval_before_after and self.task and self.rows):
            return None
        engine = make_engine(self.cfg.rollout.engine, model, tokenizer, self.cfg, seed=self.cfg.train.seed,
                             task=self.task)  # multi-turn with the task's tools when the preset has an agent
        try:
            return accuracy(engine, self.rows, self.task, self.params)
        finally:
            engine.release()


def on_device(model):
    """The model on the GPU when there is one (4-bit models are placed at load)."""
    import torch

    if torch.cuda.is_available() and not getattr(model, "is_loaded_in_4bit", False):
        model.to("cuda")
    return model


# --------------------------------------------------------------------------- the sft stage


def run_stage(cfg, run: RunDir):
    """`tinyrl sft`: SFT in `run` (continuing its newest checkpoint); returns a trainer.Run."""
    import torch

    from tinyrl.model import load_policy
    from tinyrl.planner import checkpointing
    from tinyrl.trainer import Run

    cfg = checkpointing.resolve(cfg)  # model.gradient_checkpointing auto: the run's memory plan decides
    rows = load_rows(cfg)
    if not rows:
        raise ConfigError(f"sft.data: no rows to train on from {cfg.sft.data or 'the task'}"
                         + (f" with reward >= {cfg.sft.min_reward}" if cfg.sft.min_reward is not None else ""))
    summary_path = run.path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    torch.manual_seed(cfg.train.seed)  # the LoRA init
    model, tok = load_policy(cfg.model, cfg.lora, adapter=cfg.model.adapter)
    model = on_device(model)
    held_out = HeldOut(cfg, tok)
    if "eval_before" not in summary:  # a resumed run keeps the figure it measured first
        summary = {"method": "sft", "rows": len(rows), "eval_before": held_out(model, tok)}
        log.info("sft: %d rows; held-out accuracy before: %s", len(rows), summary["eval_before"])
    summary.update(interrupted=False, error=None, eval_after=None)
    atomic_write_text(summary_path, json.dumps(summary, indent=2))
    try:
        res = fit(cfg, model, tok, rows, run.path)
        summary.update(steps=res.steps, train_loss=res.train_loss, interrupted=res.interrupted)
        if not res.interrupted:
            summary["eval_after"] = held_out(model, tok)
            log.info("sft: held-out accuracy after: %s", summary["eval_after"])
    except BaseException as e:
        summary["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        atomic_write_text(summary_path, json.dumps(summary, indent=2))
    return Run(run.path, run.metrics(), summary["eval_before"], summary["eval_after"],
               None if res.interrupted else res.adapter, interrupted=res.interrupted)
