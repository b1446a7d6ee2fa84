"""Stages: methods run in order in one run folder, each starting from the previous one's adapter.

    stages: [sft, grpo]      # a cold start, then GRPO from the SFT adapter: one command
    stages: [rest_em]        # ReST-EM alone (tinyrl/selfimprove.py)

`tinyrl train PRESET` runs a preset's stages (`api.train` dispatches here when `stages` is
set; `tinyrl sft` is `tinyrl train` with `stages=[sft]`). One stage runs in the run folder
itself, so its layout is that method's own. Several stages each get a run folder of their
own under `stages/NN-name/` (config.yaml with `model.adapter` pointing at the previous
stage's adapter, metrics.jsonl, checkpoints, adapter/, summary.json); the top folder holds
the whole config, summary.json (every stage's summary, eval_before of the first, eval_after
of the last) and adapter/ (a copy of the last stage's).

`tinyrl train --resume RUN` continues where the run stopped: finished stages (their
summary.json says so) are skipped and the interrupted one continues from its checkpoint.

This module is imported by config validation for `STAGES`: it imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Callable

from tinyrl.runs import RunDir, atomic_write_text, truncate_jsonl

log = logging.getLogger("tinyrl.stages")


def _grpo(cfg, run: RunDir):
    """GRPO in `run`, from its newest checkpoint when it has one (as `tinyrl train --resume`)."""
    from tinyrl.api import _write_summary
    from tinyrl.trainer import Trainer

    trainer = Trainer(cfg, run)
    ckpt = run.latest_checkpoint()
    if ckpt is not None:
        trainer.load_checkpoint(ckpt)
    for name in ("metrics.jsonl", "samples.jsonl", "alarms.jsonl"):
        truncate_jsonl(run.path / name, trainer.step)  # rows after the checkpoint (or all, from scratch)
    result, error = None, None
    try:
        result = trainer.train()
        return result
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        _write_summary(trainer, result, error)


def _sft(cfg, run: RunDir):
    from tinyrl.sft import run_stage

    return run_stage(cfg, run)


def _rest_em(cfg, run: RunDir):
    from tinyrl.selfimprove import run_stage

    return run_stage(cfg, run, rationalize=False)


def _star(cfg, run: RunDir):
    from tinyrl.selfimprove import run_stage

    return run_stage(cfg, run, rationalize=True)


# name -> runner(cfg, run_dir) -> trainer.Run; a runner continues whatever progress `run` holds
STAGES: dict[str, Callable] = {"sft": _sft, "grpo": _grpo, "rest_em": _rest_em, "star": _star}


def staged(preset=None, profile=None, resume=None, overrides: dict | None = None) -> bool:
    """Whether this run (a preset + overrides, or a run folder to resume) names stages. A run folder's
    config is only peeked at here: a bad override is reported by the resume itself, naming the file."""
    if resume is not None:
        from tinyrl.config import ConfigError, apply_overrides

        try:
            return bool(apply_overrides(RunDir(Path(resume)).config(), dict(overrides or {})).get("stages"))
        except (ConfigError, OSError, ValueError):
            return False
    return bool(_config(preset, profile, resume, overrides)[1].stages)


def _config(preset, profile, resume, overrides):
    """(name, config, RunDir or None): a run folder's config (+ overrides) or a preset's."""
    from tinyrl.config import apply_overrides, config_from_dict, load_config

    if resume is not None:
        run = RunDir(Path(resume))
        return run.path.name, config_from_dict(apply_overrides(run.config(), dict(overrides or {}))), run
    name, cfg = load_config(preset, dict(overrides or {}), profile)
    return name, cfg, None


def run_stages(preset=None, profile=None, resume=None, overrides: dict | None = None):
    """Run (or continue) a staged run; returns the trainer.Run of the whole run folder."""
    name, cfg, run = _config(preset, profile, resume, overrides)
    if run is None:
        run = RunDir.create(cfg.log.run_dir, cfg.log.name or name, cfg.to_dict())
    if len(cfg.stages) == 1:
        return STAGES[cfg.stages[0]](cfg, run)
    return _run_chain(cfg, run)


def stage_folder(run: RunDir, i: int, name: str) -> Path:
    return run.path / "stages" / f"{i:02d}-{name}"


def stage_config(cfg, adapter: str | None):
    """The config one stage runs: no stages of its own, starting from `adapter`."""
    return dataclasses.replace(cfg, stages=[], model=dataclasses.replace(cfg.model, adapter=adapter))


def _run_chain(cfg, run: RunDir):
    from tinyrl.trainer import Run

    adapter = cfg.model.adapter
    summaries, first, last, alarms = [], None, None, []
    for i, name in enumerate(cfg.stages, 1):
        folder = stage_folder(run, i, name)
        sub_cfg = stage_config(cfg, adapter)
        sub = _stage_run_dir(folder, sub_cfg)
        summary = _summary(folder)
        if _finished(folder, summary):
            log.info("stage %d (%s) finished earlier: %s", i, name, folder)
            result = None
        else:
            log.info("stage %d/%d: %s in %s", i, len(cfg.stages), name, folder)
            result = STAGES[name](sub_cfg, sub)
            alarms += result.alarms
            summary = _summary(folder)
        summaries.append({"stage": name, "folder": str(folder.relative_to(run.path)), **summary})
        first = summaries[0] if first is None else first
        last = summaries[-1]
        if result is not None and result.interrupted:
            _write(run, summaries, interrupted=True)
            return Run(run.path, [], first.get("eval_before"), None, interrupted=True, alarms=alarms)
        adapter = str(folder / "adapter")
    final = run.path / "adapter"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(adapter, final)
    _write(run, summaries, interrupted=False)
    return Run(run.path, [], first.get("eval_before"), last.get("eval_after"), final, alarms)


def _stage_run_dir(folder: Path, cfg) -> RunDir:
    """The stage's run folder with its config.yaml (derived from the whole run's config each time)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return RunDir(folder)


def _summary(folder: Path) -> dict:
    path = folder / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _finished(folder: Path, summary: dict) -> bool:
    return bool(summary) and not summary.get("interrupted") and not summary.get("error") \
        and (folder / "adapter" / "adapter_config.json").is_file()


def _write(run: RunDir, summaries: list[dict], interrupted: bool) -> None:
    out = {"stages": summaries, "eval_before": summaries[0].get("eval_before"),
           "eval_after": None if interrupted else summaries[-1].get("eval_after"), "interrupted": interrupted}
    atomic_write_text(run.path / "summary.json", json.dumps(out, indent=2))
