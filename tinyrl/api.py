"""The Python API: `tinyrl.train(...)` and `tinyrl.evaluate(...)`; the CLI and the UI call these."""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

from tinyrl.config import config_from_dict, load_config
from tinyrl.errors import ConfigError
from tinyrl.runs import RunDir, atomic_write_text, truncate_jsonl

log = logging.getLogger("tinyrl")


def _split_overrides(overrides: dict) -> dict:
    """Accept both {"train.steps": 5} and {"train": {"steps": 5}} (flattened to dotted keys)."""
    out = {}
    for k, v in overrides.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in _split_overrides(v).items()})
        else:
            out[k] = v
    return out


def build_trainer(preset=None, profile=None, resume=None, overrides: dict | None = None):
    """A ready Trainer: a fresh run folder, or an existing one continued from its last checkpoint.

    The run folder is locked for this process (released by `train`, or when the process
    ends); a fresh folder is removed again when the trainer cannot be built. In a run of several
    processes (tinyrl.distributed) rank 0 creates, locks and writes the folder; the others only read it."""
    from tinyrl import distributed
    from tinyrl.trainer import Trainer

    overrides = _split_overrides(overrides or {})
    if resume is not None:
        return _resume(Path(resume), preset, profile, overrides)
    name, cfg = load_config(preset, overrides, profile)
    dist, made = distributed.setup(cfg.dist.timeout_s), {}

    def create() -> str:
        made["run"] = RunDir.create(cfg.log.run_dir, cfg.log.name or name, cfg.to_dict())
        return str(made["run"].path)

    path = dist.main_value(create)
    run = made.get("run") or distributed.replica_run_dir(path)
    try:
        trainer = Trainer(cfg, run)
    except BaseException:
        run.discard()  # a failed start (a bad reward, a missing model) leaves no folder behind
        raise
    return trainer


def _resume(path: Path, preset, profile, overrides: dict):
    """Continue a run folder: its own config.yaml plus `overrides`, from the newest checkpoint that loads."""
    import yaml

    from tinyrl import checkpoint, distributed
    from tinyrl.config import ConfigError, apply_overrides
    from tinyrl.trainer import Trainer

    if preset is not None or profile is not None:
        ignored = " and ".join(x for x in (preset and f"the preset {preset!r}", profile and f"--profile {profile}") if x)
        log.warning("--resume %s: %s ignored; the run continues with its own config.yaml "
                    "(section.field=value overrides still apply)", path, ignored)
    old = RunDir(path).config()
    try:
        cfg = config_from_dict(apply_overrides(copy.deepcopy(old), overrides))
    except ConfigError as e:
        raise ConfigError(f"{path / 'config.yaml'}{' with the overrides' if overrides else ''}: {e}") from None
    dist = distributed.setup(cfg.dist.timeout_s)
    run = RunDir(path) if dist.is_main else distributed.replica_run_dir(path)  # rank 0 owns the folder
    run.lock()
    try:
        run.recover()
        dist.barrier()  # the others read the checkpoints once rank 0 has finished an interrupted save
        if not run.checkpoints():
            raise checkpoint.ResumeError(f"--resume {path}: no checkpoint in {run.ckpt_dir} to continue from "
                                         f"(set train.save_every to checkpoint during a run)")
        trainer = Trainer(cfg, run)
        ckpt = checkpoint.load_latest(trainer, run)
        changed = config_changes(ckpt.state.get("config") or old, cfg.to_dict())
        if changed:
            log.warning("--resume: the config differs from the one checkpoint %s was trained with: %s",
                        ckpt.path.name, "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()))
        if dist.is_main:
            atomic_write_text(run.path / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "step": trainer.step, "checkpoint": ckpt.path.name,
                      "overrides": overrides, "changed": {k: list(v) for k, v in changed.items()},
                      "processes": dist.world}
            log_file = run.writer("resumes.jsonl")
            log_file.write(record)
            log_file.close()
            for name in ("metrics.jsonl", "samples.jsonl", "alarms.jsonl"):
                truncate_jsonl(run.path / name, trainer.step)  # drop steps after the checkpoint
    except BaseException:
        run.unlock()
        raise
    return trainer


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


def train(preset=None, profile=None, resume=None, **overrides):
    """Train a preset (or continue `resume`, a run folder); returns the finished `Run`.

    The run folder gets summary.json and report.txt even when training stops on an error
    (the stale-weights canary, a crash): the report is most useful exactly then.
    A config with `stages` (sft, grpo, rest_em, star) runs them in order (tinyrl/stages.py)."""
    from tinyrl.stages import run_stages, staged

    if staged(preset, profile, resume, _split_overrides(overrides)):
        return run_stages(preset, profile, resume, _split_overrides(overrides))
    trainer = build_trainer(preset, profile, resume, overrides)
    run, error = None, None
    try:
        run = trainer.train()
        return run
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        try:
            if trainer.dist.is_main:  # rank 0 owns the run folder
                _write_summary(trainer, run, error)
        except OSError as e:  # a full disk must not hide the error that stopped the run
            log.warning("could not write the run summary: %s", e)
        trainer.run.unlock()


def _write_summary(trainer, run, error: str | None) -> None:
    from tinyrl.report import write_report

    summary = {"eval_before": trainer.eval_before, "eval_after": run.eval_after if run else None,
               "steps": trainer.step, "interrupted": bool(run and run.interrupted), "error": error,
               "skipped_steps": trainer.skipped_steps, "no_signal_steps": trainer.no_signal_steps,
               "reward_failures": trainer.rewards.total_failures,
               "alarms": [a["name"] for a in trainer.monitor.fired]}
    atomic_write_text(trainer.run.path / "summary.json", json.dumps(summary, indent=2))
    write_report(trainer.run.path)


def evaluate(preset=None, adapter=None, report: bool = False, **overrides):
    """Held-out greedy pass@1 of the preset's model; `adapter` is a run folder or adapter folder.

    With `report=True`, the whole `tinyrl.evaluation.EvalReport`: the task's own scores (EM, F1)
    and, for agent presets, tool calls / turns / tool error rate per question. The rollout is the
    HF engine (one card or a CPU), multi-turn when the preset's `agent.enabled`."""
    from tinyrl.data import load_rows
    from tinyrl.evaluation import evaluate_rows
    from tinyrl.model import load_policy
    from tinyrl.rollout import make_engine, prompt_renderer
    from tinyrl.rollout.base import SamplingParams

    _, cfg = load_config(preset, _split_overrides(overrides))
    model, tok = load_policy(cfg.model, cfg.lora, adapter=str(adapter) if adapter else None)
    _, rows, task = load_rows(cfg.data)
    if task is None:
        raise ConfigError("data.task: evaluate needs a built-in task with a verifier (data.task)")
    engine = make_engine("hf", model, tok, cfg, seed=cfg.train.seed, task=task)
    render = prompt_renderer(engine, tok, cfg.data)
    for r in rows:
        r["rendered"] = render(r["prompt"])
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, stop=list(cfg.rollout.stop) or task.stop)
    result = evaluate_rows(engine, rows, task, params)
    return result if report else result.accuracy
