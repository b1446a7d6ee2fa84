"""Reliability: kill -9 mid-run and resume bit for bit; atomic checkpoints; valid JSONL after crashes."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tinyrl.api import build_trainer, train
from tinyrl.checkpoint import ResumeError
from tinyrl.runs import RunDir, read_jsonl

STEPS = 6


def overrides(model_dir, run_root, name):
    return {"model.name": model_dir, "log.run_dir": run_root, "log.name": name, "log.progress": False,
            "train.steps": STEPS, "train.save_every": 1, "train.prompts_per_step": 4,
            "rollout.num_generations": 4, "train.micro_batch_size": 8, "rollout.max_new_tokens": 4,
            "data.num_train": 64, "data.num_eval": 8, "train.lr": 1e-2,
            "reward.functions": ["tests.test_training:reward_by_length"]}


def cli(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, "-m", "tinyrl.cli", "train", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def cli_args(o: dict) -> list[str]:
    return [f"{k}={v}" if not isinstance(v, list) else f"{k}={json.dumps(v)}" for k, v in o.items()]


def kill_9_after_first_checkpoint(o: dict) -> tuple[RunDir, int]:
    """Start `tinyrl train` with overrides `o`, SIGKILL it just after its first checkpoint (inside a later
    step, most likely), resume it to the end; returns the run and the step the resume started from."""
    proc = cli(cli_args(o))
    run = RunDir(Path(o["log.run_dir"]) / o["log.name"])
    deadline = time.time() + 240
    while time.time() < deadline and run.latest_checkpoint() is None and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = int(run.latest_checkpoint().name.rsplit("-", 1)[-1])
    resumed = cli(["--resume", str(run.path)])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    return run, saved


def adapter(run_path):
    return load_file(str(Path(run_path) / "adapter" / "adapter_model.safetensors"))


@pytest.mark.slow
def test_kill_9_then_resume_equals_uninterrupted_run(tiny_model_dir, run_root):
    ref = train(**overrides(tiny_model_dir, run_root, "reference"))
    kill_after = random.randint(1, STEPS - 2)  # a random step
    proc = cli(cli_args(overrides(tiny_model_dir, run_root, "killed")))
    run = RunDir(Path(run_root) / "killed")

    def saved_steps() -> int:  # the step's metrics row is written before its checkpoint: wait for the checkpoint
        latest = run.latest_checkpoint()
        return int(latest.name.rsplit("-", 1)[-1]) if latest else 0

    deadline = time.time() + 240
    while time.time() < deadline and saved_steps() < kill_after and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert run.latest_checkpoint() is not None and not (run.path / "adapter").exists()

    resumed = cli(["--resume", str(run.path)])
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    steps = [m["step"] for m in run.metrics()]
    assert steps == list(range(1, STEPS + 1))  # neither duplicated nor missing
    a, b = adapter(ref.path), adapter(run.path)
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a), f"resumed adapter differs (killed after step {kill_after})"
    ref_rewards = [m["reward_mean"] for m in ref.metrics]
    assert [m["reward_mean"] for m in run.metrics()] == ref_rewards


def test_crash_mid_checkpoint_leaves_previous_loadable(tiny_model_dir, run_root, monkeypatch):
    t = build_trainer(overrides=overrides(tiny_model_dir, run_root, "crash") | {"train.eval_before_after": False})
    t.train_step()
    good = t.save_checkpoint()
    t.train_step()

    import tinyrl.checkpoint as ckpt

    real_save = ckpt.torch.save

    def exploding_save(obj, path):
        Path(path).write_bytes(b"partial")
        raise OSError("disk vanished mid-write")

    monkeypatch.setattr(ckpt.torch, "save", exploding_save)
    with pytest.raises(OSError):
        t.save_checkpoint()
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    assert t.run.latest_checkpoint() == good  # the half-written one is invisible
    assert [p.name for p in t.run.ckpt_dir.iterdir()] == [good.name]  # and its temp directory is gone
    t.run.unlock()  # this trainer is done with the folder (train() releases it; a build_trainer caller does)
    t2 = build_trainer(resume=t.run.path, overrides={"log.progress": False})
    assert t2.state.step == 1


def test_keep_last_k(tiny_model_dir, run_root):
    o = overrides(tiny_model_dir, run_root, "keep") | {"train.steps": 4, "train.keep_last": 2,
                                                       "train.eval_before_after": False}
    run = train(**o)
    names = [p.name for p in RunDir(run.path).checkpoints()]
    assert names == ["step-000003", "step-000004"]


def test_resume_without_checkpoint_or_with_other_base_is_clear(tiny_model_dir, run_root, tmp_path):
    o = overrides(tiny_model_dir, run_root, "mismatch") | {"train.steps": 1, "train.eval_before_after": False}
    run = train(**o)
    from tests.conftest import make_tiny_model

    other = make_tiny_model(tmp_path / "wider", hidden=96)
    with pytest.raises(ResumeError, match="does not fit model"):
        build_trainer(resume=run.path, overrides={"model.name": other})
    empty = Path(run_root) / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text((run.path / "config.yaml").read_text())
    with pytest.raises(ResumeError, match="no checkpoint"):
        build_trainer(resume=empty)


def test_torn_jsonl_line_is_dropped_on_reopen(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "rew')
    w = run.writer("metrics.jsonl")
    w.write({"step": 2})
    w.close()
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [{"step": 1}, {"step": 2}]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint(tiny_model_dir, run_root):
    o = overrides(tiny_model_dir, run_root, "term") | {"train.steps": 200, "train.save_every": 0}
    args = [f"{k}={v}" if not isinstance(v, list) else f"{k}={json.dumps(v)}" for k, v in o.items()]
    proc = cli(args)
    metrics = Path(run_root) / "term" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and len(read_jsonl(metrics)) < 2 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 130
    run = RunDir(Path(run_root) / "term")
    ckpt = run.latest_checkpoint()
    assert ckpt is not None and int(ckpt.name.split("-")[1]) >= 2


def _eval_run(run_root, name, steps):
    o = {"model.name": "tiny-arith", "log.run_dir": run_root, "log.name": name, "log.progress": False,
         "train.steps": steps, "train.prompts_per_step": 2, "rollout.num_generations": 2, "train.micro_batch_size": 4,
         "data.num_eval": 3000, "data.task_args": json.dumps({"digits": 3}),  # a held-out evaluation of 2-3 s
         "rollout.max_new_tokens": 48}  # within the tiny model's 64 positions, with the prompt
    return cli([f"{k}={v}" for k, v in o.items()])


@pytest.mark.slow
@pytest.mark.parametrize("sig", [
    signal.SIGINT,
    signal.SIGTERM,
], ids=["sigint", "sigterm"])
@pytest.mark.parametrize("phase", ["before", "after"])
def test_an_interrupt_during_the_held_out_evaluation_is_clean(run_root, sig, phase):
    """Ctrl-C / SIGTERM while the before- or after-training evaluation runs: exit 130, no traceback,
    and (after training) the checkpoint and adapter already saved, the folder resumable."""
    import threading

    proc = _eval_run(run_root, f"eval-{phase}", 1)
    folder = Path(run_root) / f"eval-{phase}"
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    # the trainer logs the start of each evaluation: the signal goes out as soon as that line is read
    # (the 3000-prompt evaluation takes 2-3 s on a CPU, reading the line milliseconds)
    started = f"held-out evaluation {phase} training"
    deadline = time.time() + 240
    while time.time() < deadline and not any(started in ln for ln in lines) and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, "".join(lines)
    proc.send_signal(sig)
    rc = proc.wait(timeout=120)
    reader.join(timeout=10)
    err = "".join(lines)
    assert "held-out accuracy before training" not in err or phase == "after", err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert rc == 130, (rc, err[-3000:])
    if phase == "after":
        assert RunDir(folder).latest_checkpoint().name == "step-000001"
        resumed = cli(["--resume", str(folder), "train.eval_before_after=false"])
        assert resumed.wait(timeout=300) == 0, resumed.stderr.read()


def _signal_run(run_root, name, env: dict, **extra):
    o = overrides("tiny-arith", run_root, name) | {"train.eval_before_after": False, "train.save_every": 0,
                                                   "reward.functions": ["tests.signal_helpers:slow"], **extra}
    args = [f"{k}={v}" if not isinstance(v, list) else f"{k}={json.dumps(v)}" for k, v in o.items()]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env}
    return subprocess.Popen([sys.executable, "-m", "tinyrl.cli", "train", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc) -> None:
    deadline = time.time() + 240
    while time.time() < deadline and not path.exists() and proc.poll() is None:
        time.sleep(0.02)
    assert path.exists(), proc.communicate()


@pytest.mark.slow
def test_sigterm_during_start_up_says_so_and_leaves_no_folder(run_root, tmp_path):
    """The folder exists (config.yaml), the trainer does not yet: SIGTERM ends the command with a message
    (not rc -15 and silence) and removes the fresh folder (not one holding only its config)."""
    started = tmp_path / "starting"
    proc = _signal_run(run_root, "startup", {"TINYRL_TEST_SLOW_IMPORT": str(started)})
    _wait_for(started, proc)
    assert (Path(run_root) / "startup" / "config.yaml").exists()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "interrupted before training started; nothing was saved" in err and "Traceback" not in err, err[-3000:]
    assert not (Path(run_root) / "startup").exists()


@pytest.mark.slow
def test_a_second_sigterm_in_the_first_step_says_nothing_can_be_resumed(run_root, tmp_path):
    """No checkpoint exists yet: the stop saves nothing half-done and says plainly that nothing can be
    resumed (no `--resume` advice, which would fail); summary.json says why, not "interrupted"."""
    rewarding = tmp_path / "rewarding"
    proc = _signal_run(run_root, "abort", {"TINYRL_TEST_SLOW_REWARD": str(rewarding)})
    _wait_for(rewarding, proc)  # inside step 1: its reward is running
    proc.send_signal(signal.SIGTERM)  # the first lets the step finish...
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # ...the second stops it now
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "nothing can be resumed" in out and "nothing can be resumed" in err, (out, err[-3000:])
    assert "--resume" not in out + err and "Traceback" not in err, (out, err[-3000:])
    folder = Path(run_root) / "abort"
    summary = json.loads((folder / "summary.json").read_text())
    assert not summary["interrupted"] and "nothing to resume" in summary["error"]
    assert RunDir(folder).latest_checkpoint() is None


def test_a_signal_while_pruning_leaves_no_half_deleted_checkpoint(tiny_model_dir, run_root, monkeypatch):
    """A Ctrl-C / SIGTERM landing between steps, inside a checkpoint save's pruning (train.keep_last): the
    run stops resumable, and no `.del-step-*` folder stays in checkpoints/."""
    import shutil

    real, hit = shutil.rmtree, []

    def rmtree(path, *a, **kw):
        if Path(path).name.startswith(".del-") and not hit:
            hit.append(path)
            raise KeyboardInterrupt  # what the signal handler raises there
        return real(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    o = overrides(tiny_model_dir, run_root, "prune") | {"train.steps": 3, "train.keep_last": 1,
                                                        "train.eval_before_after": False}
    run = train(**o)
    assert hit and run.interrupted and run.resumable
    assert sorted(p.name for p in RunDir(run.path).ckpt_dir.iterdir()) == ["step-000002"]
