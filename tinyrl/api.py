"""The Python API: `tinyrl.train(...)` and `tinyrl.evaluate(...)`; the CLI and the UI call these."""

from __future__ import annotations

import json
from pathlib import Path

from tinyrl.config import config_from_dict, load_config
from tinyrl.runs import RunDir, atomic_write_text, truncate_jsonl


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
    """A ready Trainer: a fresh run folder, or an existing one continued from its last checkpoint."""
    from tinyrl.checkpoint import ResumeError
    from tinyrl.config import apply_overrides
    from tinyrl.trainer import Trainer

    overrides = _split_overrides(overrides or {})
    if resume is not None:
        run = RunDir(Path(resume))
        data = apply_overrides(run.config(), overrides)
        cfg = config_from_dict(data)
        ckpt = run.latest_checkpoint()
        if ckpt is None:
            raise ResumeError(f"--resume {resume}: no checkpoint in {run.ckpt_dir} to continue from "
                              f"(set train.save_every to checkpoint during a run)")
        trainer = Trainer(cfg, run)
        trainer.load_checkpoint(ckpt)
        for name in ("metrics.jsonl", "samples.jsonl", "alarms.jsonl"):
            truncate_jsonl(run.path / name, trainer.step)  # drop steps after the checkpoint
        return trainer
    name, cfg = load_config(preset, overrides, profile)
    run = RunDir.create(cfg.log.run_dir, cfg.log.name or name, cfg.to_dict())
    return Trainer(cfg, run)


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
        _write_summary(trainer, run, error)


def _write_summary(trainer, run, error: str | None) -> None:
    from tinyrl.report import write_report

    summary = {"eval_before": trainer.eval_before, "eval_after": run.eval_after if run else None,
               "steps": trainer.step, "interrupted": bool(run and run.interrupted), "error": error,
               "skipped_steps": trainer.skipped_steps, "no_signal_steps": trainer.no_signal_steps,
               "reward_failures": trainer.rewards.total_failures,
               "alarms": [a["name"] for a in trainer.monitor.fired]}
    atomic_write_text(trainer.run.path / "summary.json", json.dumps(summary, indent=2))
    write_report(trainer.run.path)


def evaluate(preset=None, adapter=None, **overrides) -> float:
    """Held-out greedy pass@1 of the preset's model; `adapter` is a run folder or adapter folder."""
    from tinyrl.data import load_rows, render_prompt
    from tinyrl.evaluate import accuracy
    from tinyrl.model import load_policy
    from tinyrl.rollout.base import SamplingParams
    from tinyrl.rollout.hf import HFEngine

    _, cfg = load_config(preset, _split_overrides(overrides))
    if adapter is not None and (Path(adapter) / "adapter").is_dir():
        adapter = Path(adapter) / "adapter"
    model, tok = load_policy(cfg.model, cfg.lora, adapter=str(adapter) if adapter else None)
    _, rows, task = load_rows(cfg.data)
    if task is None:
        raise ValueError("evaluate needs a built-in task with a verifier (data.task)")
    for r in rows:
        r["rendered"] = render_prompt(tok, r["prompt"], cfg.data)
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, stop=list(cfg.rollout.stop) or task.stop)
    return accuracy(HFEngine(model, tok), rows, task, params)
