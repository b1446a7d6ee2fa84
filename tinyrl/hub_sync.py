"""Checkpoints on the Hugging Face Hub while training (`log.push_to_hub: USER/NAME`), and resuming from them.

    tinyrl train tiny_grpo_cpu log.push_to_hub=me/tiny-arith-grpo train.save_every=10 log.hub_strategy=checkpoint
    tinyrl train --resume hub:me/tiny-arith-grpo          # on any machine: continue from the pushed checkpoint

`log.hub_strategy` is TRL's `hub_strategy`:

- `end`: the adapter and its model card, pushed once, at the run's last save;
- `every_save` (default): the same at every checkpoint save (`train.save_every`, the last save, a Ctrl-C's save);
- `checkpoint`: as every_save, plus `last-checkpoint/`: the newest checkpoint (adapter, optimizer, scheduler, RNG,
  prompt position: what `tinyrl train --resume` reads), the run's config.yaml and metrics.jsonl. The repo then
  holds one checkpoint, replaced at each push.

The repo's root is always a peft adapter folder with a model card (tinyrl.hub_push.model_card: the steps so far and
the held-out result before training; the result after training reaches the hub with `tinyrl export RUN --push`).

`Trainer.save_checkpoint` calls `on_save` after each checkpoint it writes (rank 0). `on_save` links the files into a
staging folder inside the run folder (a hard link: the checkpoint may be pruned meanwhile) and hands it to one
background thread per run, which creates the repo once and uploads the folder (`HfApi.create_repo`,
`HfApi.upload_folder`). Nothing the thread does blocks or fails a step: a push still running when the next save
comes is left running, and the newest save waits behind it (an older waiting one is dropped); a failed push warns
once (with the fix) and the next save pushes again; every push is recorded in the run folder's hub.jsonl. At the
last save the run waits for the last push for at most `log.hub_timeout_s`, then goes on (the push continues on a
daemon thread until the process ends). The login is checked when the run's config resolves
(tinyrl.config.switches.check_hub_login), before the model loads.

`resume_source("hub:USER/NAME[@REVISION]")` downloads the repo's `last-checkpoint/` (`HfApi.snapshot_download`) into
a new run folder (log.run_dir/NAME, as a new run's folder is made) and returns its path: `--resume` then continues
it as any run folder, pushing on to the same repo (its config.yaml names it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path

import yaml

from tinyrl import hub_push
from tinyrl.errors import ConfigError, ResumeError
from tinyrl.runs import RunDir

log = logging.getLogger("tinyrl.hub")
LAST = "last-checkpoint"  # TRL's folder name for the resumable checkpoint
HUB_PREFIX = "hub:"  # `--resume hub:USER/NAME[@REVISION]`
STAGING = ".hub-push-"  # staging folders inside the run folder (hub_push skips dot-folders too)
RECORD = "hub.jsonl"  # one line per push: step, ok, seconds, error
_REVISION = re.compile(r"^[\w.\-/]{1,100}$")
_SYNCS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # trainer -> its HubSync


def on_save(trainer, path: Path) -> Path:
    """The trainer's hook after it wrote checkpoint `path`: push it per `log.hub_strategy` (see the module
    docstring). Never raises, never waits but at the run's last save (at most log.hub_timeout_s); returns `path`."""
    cfg = trainer.cfg
    if not cfg.log.push_to_hub or not trainer.dist.is_main:
        return path
    final = trainer.state.step >= cfg.train.steps
    try:
        sync = _SYNCS.get(trainer)
        if sync is None:
            sync = _SYNCS[trainer] = HubSync(trainer.run.path, cfg.log.push_to_hub, cfg.log.hub_private)
        if cfg.log.hub_strategy != "end" or final:
            sync.submit(stage(trainer, Path(path), cfg.log.hub_strategy == "checkpoint"), trainer.state.step)
    except Exception as e:  # noqa: BLE001 - a push never fails the run
        log.warning("log.push_to_hub: could not prepare the push of step %d: %s: %s; training goes on",
                    trainer.state.step, type(e).__name__, e)
        return path
    if final and not sync.wait(cfg.log.hub_timeout_s):
        log.warning("log.push_to_hub: the push of step %d to %s has not finished after %gs (log.hub_timeout_s); not "
                    "waiting longer (it goes on until this process ends). `tinyrl export %s --push %s` uploads the "
                    "finished adapter", trainer.state.step, cfg.log.push_to_hub, cfg.log.hub_timeout_s,
                    trainer.run.path, cfg.log.push_to_hub)
    return path


def stage(trainer, ckpt: Path, with_checkpoint: bool) -> Path:
    """A folder laid out as the repo gets it: the checkpoint's adapter at the root, and with `with_checkpoint`
    last-checkpoint/ (config.yaml, metrics.jsonl, checkpoints/<step>/). Files are hard-linked (copied across file
    systems); the card's facts (shadow config.yaml and summary.json of the run so far) go in `.card/`."""
    run = Path(trainer.run.path)
    staging = Path(tempfile.mkdtemp(dir=run, prefix=STAGING))
    try:
        _link_tree(ckpt / "adapter", staging, skip=("README.md",))  # peft writes its own card there: ours replaces it
        if with_checkpoint:
            last = staging / LAST
            _link_tree(ckpt, last / "checkpoints" / ckpt.name)
            for name in ("config.yaml", "metrics.jsonl"):
                if (run / name).is_file():
                    shutil.copy2(run / name, last / name)  # copied: the run goes on appending to metrics.jsonl
        card = staging / ".card" / run.name  # the card is named after the run folder
        card.mkdir(parents=True)
        shutil.copy2(run / "config.yaml", card / "config.yaml")
        st = trainer.state
        facts = {"method": "grpo", "steps": st.step, "eval_before": st.eval_before, "eval_after": None,
                 "interrupted": False, "error": None, "details": {"eval_sampled": dict(st.eval_sampled)}}
        (card / "summary.json").write_text(json.dumps(facts))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _link_tree(src: Path, dst: Path, skip: tuple = ()) -> None:
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_dir() or rel.as_posix() in skip:
            continue
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f, out)
        except OSError:
            shutil.copy2(f, out)


class HubSync:
    """One run's pushes: at most one upload in flight on a daemon thread (which ends when there is nothing left to
    push), the newest staged save waiting behind it."""

    def __init__(self, run_path: Path, repo: str, private: bool):
        self.run_path, self.repo, self.private = Path(run_path), repo, private
        self.cond = threading.Condition()
        self.pending: tuple[Path, int] | None = None  # (staging folder, step)
        self.busy = False  # a worker thread is running (pushing, or about to take `pending`)
        self.failed = 0  # pushes failed since the last one that went up
        self.warned = False  # a failure warns once a run; the others are info lines (and hub.jsonl rows)
        self.repo_ready = False
        for old in self.run_path.glob(f"{STAGING}*"):  # what a process that died mid-push left
            shutil.rmtree(old, ignore_errors=True)

    def submit(self, staging: Path, step: int) -> None:
        with self.cond:
            if self.pending is not None:  # a newer save replaces the one still waiting
                shutil.rmtree(self.pending[0], ignore_errors=True)
            self.pending = (staging, step)
            if not self.busy:
                self.busy = True
                threading.Thread(target=self._loop, name=f"tinyrl-hub-push-{self.repo}", daemon=True).start()

    def wait(self, timeout_s: float) -> bool:
        """Whether every submitted push finished within `timeout_s` seconds."""
        with self.cond:
            return self.cond.wait_for(lambda: not self.busy, timeout=timeout_s)

    def _loop(self) -> None:
        while True:
            with self.cond:
                if self.pending is None:
                    self.busy = False
                    self.cond.notify_all()
                    return
                (staging, step), self.pending = self.pending, None
            try:
                self._push_one(staging, step)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def _push_one(self, staging: Path, step: int) -> None:
        t0 = time.monotonic()
        try:
            url = self.push(staging, step)
        except Exception as e:  # noqa: BLE001 - reported, retried by the next save, never raised into the run
            self.failed += 1
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self._record(step, False, time.monotonic() - t0, error=why)
            (log.info if self.warned else log.warning)(
                "log.push_to_hub: pushing step %d to %s failed (%s); training goes on and the next save pushes "
                "again%s", step, self.repo, why, "" if self.warned else " (said once; hub.jsonl records every push)")
            self.warned = True
            return
        self._record(step, True, time.monotonic() - t0, url=url)
        log.info("log.push_to_hub: step %d pushed to %s%s", step, self.repo,
                 f" (after {self.failed} failed push(es))" if self.failed else "")
        self.failed = 0

    def push(self, staging: Path, step: int) -> str:
        hub = hub_push._hub()
        api = hub.HfApi(token=hub_push.login_token())
        if not self.repo_ready:
            api.create_repo(self.repo, private=self.private, exist_ok=True, repo_type="model")
            self.repo_ready = True
        card_dir = staging / ".card"
        try:
            card = hub_push.model_card(next(card_dir.iterdir()), kind="adapter", repo_id=self.repo)
            (staging / "README.md").write_text(card)
        except Exception as e:  # noqa: BLE001 - the adapter goes up without its card rather than not at all
            log.info("log.push_to_hub: no model card for step %d (%s: %s)", step, type(e).__name__, e)
        shutil.rmtree(card_dir, ignore_errors=True)
        with_ckpt = (staging / LAST).is_dir()
        info = api.upload_folder(repo_id=self.repo, folder_path=str(staging), repo_type="model",
                                 commit_message=f"tinyrl: step {step} of run {self.run_path.name}",
                                 delete_patterns=[f"{LAST}/checkpoints/**"] if with_ckpt else None)
        return str(getattr(info, "commit_url", None) or info)

    def _record(self, step: int, ok: bool, seconds: float, **more) -> None:
        try:
            with open(self.run_path / RECORD, "a") as f:
                f.write(json.dumps({"step": step, "repo": self.repo, "ok": ok, "seconds": round(seconds, 3),
                                    "time": time.strftime("%Y-%m-%d %H:%M:%S"), **more}) + "\n")
        except OSError:
            pass  # a full disk: the log line said it


# ------------------------------------------------------------------ resume from the hub


def parse_hub_resume(spec: str) -> tuple[str, str | None]:
    """(repo id, revision or None) of `hub:USER/NAME[@REVISION]`; ConfigError naming --resume otherwise.

    >>> parse_hub_resume("hub:me/run@main"), parse_hub_resume("hub:me/run")
    (('me/run', 'main'), ('me/run', None))
    """
    repo, at, revision = spec[len(HUB_PREFIX):].partition("@")
    try:
        hub_push.check_repo_id(repo)
    except ConfigError:
        raise ConfigError(f"--resume: hub:USER/NAME[@REVISION] names a hub repo (letters, digits, '-', '_', '.'), "
                          f"got {spec!r:.120}") from None
    if ".." in repo or (at and not (_REVISION.match(revision) and ".." not in revision)):
        raise ConfigError(f"--resume: {spec!r:.120}: a repo id without '..' and a revision of letters, digits, "
                          f"'-', '_', '.', '/' (a branch, a tag or a commit)")
    return repo, revision or None


def resume_source(resume, overrides: dict | None = None):
    """`--resume` as a run folder: `hub:USER/NAME[@REVISION]` is downloaded into a new one (its path returned,
    under the overrides' log.run_dir, else the pushed config's); anything else is returned as it is."""
    if not (isinstance(resume, str) and resume.startswith(HUB_PREFIX)):
        return resume
    repo, revision = parse_hub_resume(resume)
    o = overrides or {}
    run_dir = o.get("log.run_dir") or (o["log"].get("run_dir") if isinstance(o.get("log"), dict) else None)
    if run_dir is not None and not isinstance(run_dir, str):
        raise ConfigError(f"log.run_dir: a folder path, got {run_dir!r:.60}")
    hub = hub_push._hub()
    from huggingface_hub import errors

    with tempfile.TemporaryDirectory(prefix="tinyrl-hub-resume-") as tmp:
        try:
            hub.HfApi(token=hub.get_token() or None).snapshot_download(
                repo, repo_type="model", revision=revision, local_dir=tmp, allow_patterns=[f"{LAST}/**"])
        except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError) as e:
            raise ResumeError(f"--resume {resume}: {type(e).__name__}: no such repo or revision on the hub (a private "
                              f"repo needs `hf auth login`)") from None
        except (*hub_push._http_errors(hub), OSError, errors.LocalEntryNotFoundError) as e:
            raise ResumeError(f"--resume {resume}: cannot download it ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
        return str(_unpack(Path(tmp) / LAST, resume, repo, run_dir))


def _unpack(last: Path, resume: str, repo: str, run_dir: str | None) -> Path:
    ckpts = sorted((last / "checkpoints").glob("step-*")) if (last / "checkpoints").is_dir() else []
    if not (last / "config.yaml").is_file() or not ckpts:
        raise ResumeError(f"--resume {resume}: the repo holds no {LAST}/ with a checkpoint: it was pushed with "
                          f"log.hub_strategy end or every_save (the adapter only). Train from that adapter with "
                          f"model.adapter=<a local copy>, or push with log.hub_strategy=checkpoint to resume")
    try:
        config = yaml.safe_load((last / "config.yaml").read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ResumeError(f"--resume {resume}: its {LAST}/config.yaml is corrupt ({type(e).__name__})") from None
    if not isinstance(config, dict):
        raise ResumeError(f"--resume {resume}: its {LAST}/config.yaml is not a tinyrl run config")
    logs = config.get("log") if isinstance(config.get("log"), dict) else {}
    root = run_dir or logs.get("run_dir") or "runs"
    run = RunDir.create(str(root), repo.split("/")[1], config)  # NAME, or NAME-<time> when taken
    try:
        shutil.move(str(last / "checkpoints"), str(run.ckpt_dir))
        if (last / "metrics.jsonl").is_file():
            shutil.move(str(last / "metrics.jsonl"), str(run.path / "metrics.jsonl"))
        (run.path / "hub.json").write_text(json.dumps({"resumed_from": repo, "spec": resume,
                                                       "checkpoint": ckpts[-1].name}) + "\n")
    except BaseException:
        run.unlock()
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    run.unlock()
    log.info("--resume %s: %s downloaded into %s", resume, ckpts[-1].name, run.path)
    return run.path
