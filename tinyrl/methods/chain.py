"""Several methods in order in one run folder, each starting from the previous one's adapter.

    stages: [sft, grpo]      # a cold start, then GRPO from the SFT adapter: one command
    stages: [rest_em]        # one stage: that method alone, in the run folder itself

(`tinyrl.methods.run` runs a single stage directly; `tinyrl sft` is `tinyrl train` with
`stages=[sft]`.) Several stages each get a run folder of their own under `stages/NN-name/`
(config.yaml with `model.adapter` pointing at the previous stage's adapter, metrics.jsonl,
checkpoints, adapter/, summary.json); the top folder holds the whole config, summary.json (the
common schema: eval_before of the first stage, eval_after of the last, every stage's summary in
`details.stages`) and adapter/ (a copy of the last stage's).

`tinyrl train --resume RUN` continues where the run stopped: finished stages (their
summary.json says so) are skipped and the interrupted one continues from its checkpoint.

A stage starts from the adapter the previous one ended with and evaluates on the same held-out rows,
greedily: its "before" is the previous stage's "after", so it is carried over (the new stage's
summary.json is seeded with it; `details.eval_before_from` names the stage), not measured twice. Not
with `train.eval_samples` (the pass@k before would be missing).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import yaml

from tinyrl import distributed
from tinyrl.methods.common import Summary, read_summary, write_summary
from tinyrl.methods.registry import METHODS
from tinyrl.runs import Run, RunDir, atomic_write_text

log = logging.getLogger("tinyrl.stages")


def run(cfg, run_dir: RunDir, resume: bool = False) -> Run:
    """Run (or continue) every stage of `cfg.stages` in order; returns the Run of the whole folder."""
    adapter = cfg.model.adapter
    summaries, alarms = [], []
    for i, name in enumerate(cfg.stages, 1):
        folder = stage_folder(run_dir, i, name)
        sub_cfg = stage_config(cfg, adapter)
        sub = _stage_run_dir(folder, sub_cfg, _carried(cfg, name, summaries[-1:]))
        summary = read_summary(sub)
        if _finished(folder, summary):
            log.info("stage %d (%s) finished earlier: %s", i, name, folder)
            result = None
        else:
            log.info("stage %d/%d: %s in %s", i, len(cfg.stages), name, folder)
            result = METHODS[name](sub_cfg, sub)
            alarms += result.alarms
            summary = read_summary(sub)
        summaries.append({"stage": name, "folder": str(folder.relative_to(run_dir.path)), **summary})
        if result is not None and result.interrupted:
            _write(run_dir, summaries, interrupted=True)
            return Run(run_dir.path, [], summaries[0].get("eval_before"), None, interrupted=True, alarms=alarms,
                       resumable=result.resumable or len(summaries) > 1)  # a finished stage is kept
        adapter = str(folder / "adapter")
    final = run_dir.path / "adapter"
    if distributed.setup().is_main:  # [dist] rank 0 owns the run folder
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(adapter, final)
    _write(run_dir, summaries, interrupted=False)
    return Run(run_dir.path, [], summaries[0].get("eval_before"), summaries[-1].get("eval_after"), final, alarms)


def stage_folder(run: RunDir, i: int, name: str) -> Path:
    return run.path / "stages" / f"{i:02d}-{name}"


def stage_config(cfg, adapter: str | None):
    """The config one stage runs: no stages of its own, starting from `adapter`."""
    return dataclasses.replace(cfg, stages=[], model=dataclasses.replace(cfg.model, adapter=adapter))


def _carried(cfg, name: str, previous: list[dict]) -> Summary | None:
    """The summary a fresh stage starts with: the previous stage's held-out "after" as its "before"."""
    if not previous or previous[0].get("eval_after") is None or cfg.train.eval_samples:
        return None
    return Summary(name, eval_before=previous[0]["eval_after"], details={"eval_before_from": previous[0]["folder"]})


def _stage_run_dir(folder: Path, cfg, seed: Summary | None = None) -> RunDir:
    """The stage's run folder with its config.yaml (derived from the whole run's config each time), and `seed` as
    its summary.json when it has none yet: written by rank 0, which owns the folders (before the barrier, so every
    rank's method reads the same summary); the other ranks get a replica that writes nothing (as for the top
    folder)."""
    dist = distributed.setup()
    if not dist.is_main:
        dist.barrier()  # rank 0 has written the folder
        return distributed.replica_run_dir(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    run = RunDir(folder)
    if seed is not None and not read_summary(run):
        write_summary(run, seed)
    dist.barrier()
    return run


def _finished(folder: Path, summary: dict) -> bool:
    return bool(summary) and not summary.get("interrupted") and not summary.get("error") \
        and (folder / "adapter" / "adapter_config.json").is_file()


def _write(run: RunDir, summaries: list[dict], interrupted: bool) -> None:
    write_summary(run, Summary("chain", sum(s.get("steps", 0) for s in summaries), summaries[0].get("eval_before"),
                               None if interrupted else summaries[-1].get("eval_after"), interrupted,
                               alarms=[a for s in summaries for a in s.get("alarms", [])],
                               details={"stages": summaries}))
