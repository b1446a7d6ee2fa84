"""Run folders that one process owns, checkpoints that survive any kill, resume that says what it did.

Fast tests work on RunDir directly or on one tiny finished run (copied per test); the
subprocess tests (kill -9 aimed at the checkpoint-replacement window, two writers of one
folder) are marked slow.
"""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tinyrl.api import build_trainer, train
from tinyrl.checkpoint import STATE_FILE, ResumeError
from tinyrl.config import ConfigError
from tinyrl.rewards.core import RewardImportError
from tinyrl.runs import KILL_ENV, LOCK_FILE, RunDir, RunLockedError, atomic_write_text, read_jsonl

REPO = Path(__file__).resolve().parents[1]
TINY = {"model.name": "tiny-arith", "train.steps": 2, "train.prompts_per_step": 2, "rollout.num_generations": 2,
        "train.micro_batch_size": 4, "train.eval_before_after": False, "log.progress": False,
        "train.save_every": 1, "train.keep_last": 3, "data.num_train": 16, "data.num_eval": 4,
        "rollout.max_new_tokens": 6}


def cli_args(overrides: dict) -> list[str]:
    return [f"{k}={json.dumps(v) if isinstance(v, (list, dict, bool)) or v is None else v}"
            for k, v in overrides.items()]


def cli(args, env=None, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "tinyrl.cli", "train", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished two-step run of the shipped tiny model, checkpointed after each step."""
    root = tmp_path_factory.mktemp("runs")
    run = train(**TINY, **{"log.run_dir": str(root), "log.name": "done"})
    return run.path


@pytest.fixture
def run_copy(finished_run, tmp_path):
    dst = tmp_path / "runs" / "copy"
    shutil.copytree(finished_run, dst)
    (dst / LOCK_FILE).unlink(missing_ok=True)
    return dst


# --------------------------------------------------------------------------- one owner per folder


def test_runs_with_the_same_name_at_the_same_moment_get_different_folders(tmp_path):
    runs, barrier = [None] * 8, threading.Barrier(8)

    def start(i):
        barrier.wait()
        runs[i] = RunDir.create(str(tmp_path), "same", {"i": i})

    threads = [threading.Thread(target=start, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    paths = {r.path for r in runs}
    assert len(paths) == 8  # an exclusive mkdir each: nobody shares (or overwrites) a folder
    import yaml

    assert sorted(yaml.safe_load((r.path / "config.yaml").read_text())["i"] for r in runs) == list(range(8))


def test_concurrent_writes_of_one_file_use_unique_temp_names(tmp_path):
    target = tmp_path / "config.yaml"
    errors, barrier = [], threading.Barrier(6)

    def write(i):
        barrier.wait()
        try:
            for _ in range(30):
                atomic_write_text(target, f"writer: {i}\n" * 200)
        except Exception as e:  # a fixed temp name makes one writer rename the other's file away
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    lines = set(target.read_text().splitlines())
    assert len(lines) == 1 and len(target.read_text().splitlines()) == 200  # one writer's file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temp file left


def test_a_second_writer_is_refused_until_the_first_is_done(tmp_path):
    first, second = RunDir(tmp_path), RunDir(tmp_path)
    first.lock()
    with pytest.raises(RunLockedError, match=f"in use by pid {os.getpid()} on host {socket.gethostname()}"):
        second.lock()
    first.unlock()
    second.lock()  # free again
    second.unlock()


def test_a_lock_held_by_another_process_then_left_behind_when_it_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from tinyrl.runs import RunDir; "
                               f"run = RunDir({str(tmp_path)!r}); run.lock(); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"in use by pid {holder.pid}"):
            RunDir(tmp_path).lock()
    finally:
        holder.kill()
        holder.wait()
    assert str(holder.pid) in (tmp_path / LOCK_FILE).read_text()  # it died holding the lock: the record stays
    run = RunDir(tmp_path)
    run.lock()  # the kernel dropped its flock and its pid is gone: a stale lock, taken over
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    run.unlock()


def test_a_lock_recorded_by_another_host_is_not_taken_over(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere.example", "started": "then"}))
    with pytest.raises(RunLockedError, match="cannot be checked from"):
        RunDir(tmp_path).lock()


def test_log_name_cannot_leave_the_runs_dir(tmp_path):
    for name in ("../escaped", "/tmp/abs", "a/../../b"):
        with pytest.raises(ConfigError, match="log.name"):
            build_trainer(overrides={**TINY, "log.run_dir": str(tmp_path / "runs"), "log.name": name})
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="log.name"):
        RunDir.create(str(tmp_path / "runs"), "../escaped", {})
    assert not (tmp_path / "escaped").exists()


def test_a_failed_start_leaves_no_run_folder(tmp_path):
    root = tmp_path / "runs"
    with pytest.raises(RewardImportError):
        build_trainer(overrides={**TINY, "log.run_dir": str(root), "reward.functions": ["no_such_reward"]})
    from tinyrl.model import ModelLoadError

    with pytest.raises(ModelLoadError):
        build_trainer(overrides={**TINY, "log.run_dir": str(root), "model.name": str(tmp_path / "no-model")})
    assert list(root.iterdir()) == []


# --------------------------------------------------------------------------- checkpoints


class SimulatedKill(BaseException):
    """Stands for a kill at that instant: nothing after it runs (no except / finally of ours catches it)."""


def test_replacing_a_checkpoint_never_leaves_the_step_without_one(tmp_path, monkeypatch):
    run = RunDir(tmp_path)

    def writer(value):
        def write(d):
            (d / "adapter").mkdir()
            (d / "adapter" / "w").write_text(value)
            (d / STATE_FILE).write_text(value)
        return write

    run.save_checkpoint(1, writer("old"), keep_last=2)
    real_rename = os.rename

    def kill_when_the_new_one_moves_in(src, dst):
        if Path(src).name.startswith(".tmp-"):
            raise SimulatedKill
        return real_rename(src, dst)

    monkeypatch.setattr("tinyrl.runs.os.rename", kill_when_the_new_one_moves_in)
    with pytest.raises(SimulatedKill):
        run.save_checkpoint(1, writer("new"), keep_last=2)
    monkeypatch.setattr("tinyrl.runs.os.rename", real_rename)
    run = RunDir(tmp_path)
    notes = run.recover()
    assert any("restored step-000001" in n for n in notes), notes
    (ckpt,) = run.checkpoints()
    assert (ckpt / STATE_FILE).read_text() == "old" and (ckpt / "adapter" / "w").read_text() == "old"
    assert [p.name for p in run.ckpt_dir.iterdir()] == ["step-000001"]  # the half-made new one is cleaned away
    run.save_checkpoint(1, writer("new"), keep_last=2)  # and a replacement that completes replaces it
    assert (run.latest_checkpoint() / STATE_FILE).read_text() == "new"
    assert [p.name for p in run.ckpt_dir.iterdir()] == ["step-000001"]


KILLER = r'''
import os, sys
from pathlib import Path
from tinyrl.runs import KILL_ENV, RunDir
point, root = sys.argv[1], sys.argv[2]
run = RunDir(root)
def writer(value):
    def write(d):
        (d / "adapter").mkdir()
        (d / "adapter" / "w").write_text(value)
        (d / "trainer_state.pt").write_text(value)
    return write
for step in (1, 2):
    run.save_checkpoint(step, writer(f"old{step}"), keep_last=2)
os.environ[KILL_ENV] = point
run.save_checkpoint(2, writer("new2"), keep_last=2)  # a replacement (interrupt right after a save)
run.save_checkpoint(3, writer("new3"), keep_last=2)  # a new step that prunes step 1
'''


@pytest.mark.parametrize("point", ["checkpoint-written", "checkpoint-aside", "checkpoint-renamed",
                                   "checkpoint-pruning"])
def test_kill_9_at_each_point_of_a_checkpoint_save_leaves_complete_checkpoints(tmp_path, point):
    proc = subprocess.run([sys.executable, "-c", KILLER, point, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run = RunDir(tmp_path)
    run.recover()
    names = [p.name for p in run.ckpt_dir.iterdir()]
    assert all(n.startswith("step-") for n in names), names  # nothing half-made or half-deleted is left
    for ckpt in run.checkpoints():  # every checkpoint there is complete, old or new
        assert (ckpt / STATE_FILE).read_text() == (ckpt / "adapter" / "w").read_text()
    assert "step-000002" in names


def test_resume_falls_back_to_the_newest_checkpoint_that_loads(run_copy, caplog):
    run = RunDir(run_copy)
    newest = run.latest_checkpoint()
    assert newest.name == "step-000002"
    state = newest / STATE_FILE
    state.write_bytes(state.read_bytes()[:1000])  # truncated
    with caplog.at_level(logging.WARNING):
        t = build_trainer(resume=run_copy)
    t.run.unlock()
    assert t.state.step == 1
    text = caplog.text
    assert "skipping checkpoint step-000002" in text and "trainer_state.pt is truncated or corrupt" in text
    assert [p.name for p in RunDir(run_copy).checkpoints()] == ["step-000001"]
    assert any(p.name.startswith(".corrupt-step-000002") for p in run.ckpt_dir.iterdir())  # kept, set aside
    assert [m["step"] for m in read_jsonl(run_copy / "metrics.jsonl")] == [1]  # step 2 is trained again


def test_resume_with_no_checkpoint_that_loads_names_each(run_copy):
    for ckpt in RunDir(run_copy).checkpoints():
        f = ckpt / "adapter" / "adapter_model.safetensors"
        f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ResumeError, match="no checkpoint loads: step-000002: .*adapter_model.safetensors is "
                                          "truncated or corrupt.*step-000001"):
        build_trainer(resume=run_copy)
    RunDir(run_copy).lock()  # the failed resume released the folder


def test_resume_says_what_it_ignores_and_changes_and_records_it(run_copy, caplog):
    import yaml

    with caplog.at_level(logging.WARNING):
        t = build_trainer(preset="tiny_grpo_cpu", profile=None, resume=run_copy,
                          overrides={"train.steps": 4, "train.lr": 2e-3})
    t.run.unlock()
    assert "the preset 'tiny_grpo_cpu' ignored" in caplog.text
    assert "train.steps: 2 -> 4" in caplog.text and "train.lr: 0.001 -> 0.002" in caplog.text
    cfg = yaml.safe_load((run_copy / "config.yaml").read_text())
    assert cfg["train"]["steps"] == 4 and cfg["train"]["lr"] == 2e-3  # the config the run now continues with
    (record,) = read_jsonl(run_copy / "resumes.jsonl")
    assert record["checkpoint"] == "step-000002" and record["overrides"] == {"train.steps": 4, "train.lr": 2e-3}
    assert record["changed"]["train.steps"] == [2, 4]


def test_resume_of_a_folder_in_use_is_refused(run_copy):
    holder = RunDir(run_copy)
    holder.lock()
    with pytest.raises(RunLockedError, match="in use by pid"):
        build_trainer(resume=run_copy)
    holder.unlock()


def test_reward_timeout_reaches_the_reward_set(tmp_path):
    t = build_trainer(overrides={**TINY, "log.run_dir": str(tmp_path), "reward.timeout": 2.5})
    assert t.rewards.timeout == 2.5
    t.run.unlock()


def infinite_reward(prompts, completions, **kw):
    return [float("inf") if i % 2 else 1.0 for i in range(len(completions))]


def test_an_inf_reward_never_reaches_metrics_as_infinity(tmp_path):
    run = train(**TINY, **{"log.run_dir": str(tmp_path), "log.name": "inf",
                           "reward.functions": [f"{__name__}:infinite_reward"]})

    def strict(name):
        raise ValueError(f"{name} in strict JSON")

    for name in ("metrics.jsonl", "samples.jsonl"):
        rows = [json.loads(line, parse_constant=strict) for line in (run.path / name).read_text().splitlines()]
        assert rows
    metrics = read_jsonl(run.path / "metrics.jsonl")
    assert all(m["reward_failures"] == 2 for m in metrics)  # half of the 4 samples each step
    assert all(m["reward/infinite_reward"] == 1.0 for m in metrics)


# --------------------------------------------------------------------------- subprocesses (slow)

KILL_POINTS = ["checkpoint-written", "checkpoint-aside", "checkpoint-renamed", "checkpoint-pruning"]


@pytest.mark.slow
def test_kill_9_aimed_at_the_checkpoint_replacement_window_always_leaves_a_resumable_run(tmp_path):
    """Each kill lands in a checkpoint save (TINYRL_TEST_KILL_AT): during the replacement that the
    resume of a finished run makes, or while pruning. Every killed folder resumes to the same adapter."""
    o = {**TINY, "train.steps": 3, "train.keep_last": 2, "log.run_dir": str(tmp_path)}
    ref = train(**o, **{"log.name": "reference"})
    want = load_file(str(ref.path / "adapter" / "adapter_model.safetensors"))
    for point in KILL_POINTS:
        folder = tmp_path / point
        if point == "checkpoint-pruning":  # a fresh run, killed while the save at step 3 prunes step 1
            proc = cli(cli_args({**o, "log.name": point}), env={KILL_ENV: point})
        else:  # the resume of the finished run replaces its step-3 checkpoint
            shutil.copytree(ref.path, folder)
            (folder / LOCK_FILE).unlink()
            shutil.rmtree(folder / "adapter")
            proc = cli(["--resume", str(folder)], env={KILL_ENV: point})
        assert proc.wait(timeout=300) == -signal.SIGKILL, (point, proc.stderr.read())
        again = cli(["--resume", str(folder)])
        assert again.wait(timeout=300) == 0, (point, again.stderr.read())
        got = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
        assert all((got[k] == want[k]).all() for k in want), point
        assert [m["step"] for m in read_jsonl(folder / "metrics.jsonl")] == [1, 2, 3], point
        assert all(p.name.startswith("step-") for p in (folder / "checkpoints").iterdir()), point


@pytest.mark.slow
def test_two_writers_of_one_folder_the_second_is_refused_and_nothing_is_lost(run_copy):
    # the first is stopped (SIGSTOP) once it holds the folder, so it still holds it however long the second
    # takes to start up; timing alone raced on a busy machine (the first finished and the second resumed)
    first = cli(["--resume", str(run_copy), "train.steps=8"])
    lock = run_copy / LOCK_FILE
    deadline = time.time() + 240
    while time.time() < deadline and first.poll() is None:
        try:
            if json.loads(lock.read_text() or "{}").get("pid") == first.pid:
                break
        except (ValueError, OSError):  # not there yet, or being written
            pass
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        assert first.poll() is None, "the first writer ended before it was seen holding the folder"
        second = cli(["--resume", str(run_copy), "train.steps=8"])
        assert second.wait(timeout=120) == 2
    finally:
        os.kill(first.pid, signal.SIGCONT)
    err = second.stderr.read()
    assert f"is in use by pid {first.pid}" in err and "Traceback" not in err
    assert first.wait(timeout=600) == 0, first.stderr.read()
    assert [m["step"] for m in read_jsonl(run_copy / "metrics.jsonl")] == list(range(1, 9))


@pytest.mark.slow
def test_two_fresh_runs_with_one_name_started_together_get_two_folders(tmp_path):
    o = cli_args({**TINY, "log.run_dir": str(tmp_path), "log.name": "twin", "train.steps": 1})
    procs = [cli(o), cli(o)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert len(folders) == 2 and folders[0] == "twin"
    for f in folders:
        assert [m["step"] for m in read_jsonl(tmp_path / f / "metrics.jsonl")] == [1]
        assert (tmp_path / f / "adapter" / "adapter_model.safetensors").exists()


def test_a_run_name_of_dot_is_refused_not_written_beside_the_run_dir(tmp_path):
    """`log.name=.` is the run_dir itself (Path('.') has no part): refused at the config and at the folder."""
    from tinyrl.config import ConfigError, load_config

    for name in (".", "./.", ""):
        with pytest.raises(ConfigError, match="log.name"):
            RunDir.create(str(tmp_path / "runs"), name, {})
    with pytest.raises(ConfigError, match="log.name: must be a folder name inside log.run_dir"):
        load_config(None, {"log.name": "."})
    assert [p.name for p in tmp_path.iterdir() if p.name != "runs"] == []
