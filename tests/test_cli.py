"""`tinyrl train` on the embedded default, from the command line, end to end."""

import json
import subprocess
import sys

import pytest

from tinyrl.runs import read_jsonl


@pytest.mark.slow
def test_default_preset_trains_from_the_cli_and_reward_rises(tmp_path):
    # A small budget of the default preset (shipped tiny model, arithmetic verifier). The CPU
    # path is deterministic for a seed, so this run's reward curve is the same every time.
    out = subprocess.run(
        [sys.executable, "-m", "tinyrl.cli", "train", f"log.run_dir={tmp_path}", "log.name=cli",
         "train.steps=30", "rollout.num_generations=16", "train.micro_batch_size=128", "data.num_eval=50",
         "log.progress=false"],
        capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out accuracy (greedy pass@1)" in out.stdout and "before" in out.stdout
    run = tmp_path / "cli"
    for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "report.txt", "adapter"):
        assert (run / name).exists(), name
    rewards = [m["reward_mean"] for m in read_jsonl(run / "metrics.jsonl")]
    assert len(rewards) == 30
    early, late = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert late > early, (early, late)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["eval_before"] is not None


def test_cli_bad_preset_field_is_one_clear_line_and_nonzero_exit(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", "algo.scale=groups"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == "tinyrl: error: algo.scale: expected one of 'group', 'batch', 'none', got 'groups'"


def test_cli_presets_lists_the_default():
    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "presets"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "tiny_grpo_cpu (default)" in out.stdout


@pytest.mark.slow
def test_first_run_shows_no_third_party_noise(tmp_path):
    import logging

    from tinyrl.model import quiet_third_party_noise

    out = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", f"log.run_dir={tmp_path}", "train.steps=1",
                          "data.num_eval=4", "log.progress=false"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "FutureWarning" not in out.stderr and "is_gradient_checkpointing" not in out.stderr
    # bitsandbytes logs its kernels-community message only on AVX512-BF16 CPUs: check the filter itself
    quiet_third_party_noise()
    records = []
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s.", "offline")
        logger.warning("something else")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["something else"]


def _start_and_wait_for(tmp_path, line: str, *args):
    import os
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-m", "tinyrl.cli", "train", f"log.run_dir={tmp_path}", "log.name=r",
                          "log.progress=false", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    for err in p.stderr:
        if line in err:
            p.send_signal(signal.SIGTERM)
            break
        assert time.time() < deadline
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err, os.path.join(tmp_path, "r")


@pytest.mark.slow
def test_sigterm_during_the_evaluation_before_training_checkpoints_and_resumes(tmp_path):
    rc, out, err, run = _start_and_wait_for(tmp_path, "held-out evaluation before training",
                                            "data.num_eval=700", "train.steps=2")
    assert rc == 130 and "Traceback" not in err, err[-2000:]
    assert "interrupted" in out
    res = subprocess.run([sys.executable, "-m", "tinyrl.cli", "train", "--resume", run, "data.num_eval=20"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(read_jsonl(__import__("pathlib").Path(run) / "metrics.jsonl")) == 2
