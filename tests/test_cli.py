"""`tinyrl train` on the embedded default, from the command line, end to end."""

import json
import subprocess
import sys

from tinyrl.runs import read_jsonl


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
