"""scripts/gpu_check.sh: its --cpu dry run runs in the default suite, so the GPU check cannot rot.

The dry run imports tinyrl through the same symlink shim a bare GPU machine uses (tinyrl not
installed), runs the Triton loss under TRITON_INTERPRET=1 against the torch reference, and a
GRPO step of a shrunken Qwen2-shaped model, and names what it cannot run. The gpu-marked test
below is what gpu_check runs on a card: the planner against torch.cuda.max_memory_allocated.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # its reward is named "gpu_check:spread_reward"
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # ~1 min on 2 loaded cores; the README's test command runs it (CI)
def test_cpu_dry_run_report(tmp_path):
    out = tmp_path / "report.json"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", "--shim", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    secs = rep["sections"]
    assert rep["cpu"] and secs["env"]["tinyrl_import"].startswith("repository via import shim")
    assert secs["tests"]["status"] == "ok"
    loss = secs["fused_loss"]
    if importlib.util.find_spec("triton") is None:
        assert loss["status"] == "skipped" and "triton" in loss["reason"]
    else:
        (case,) = loss["cases"]
        assert loss["interpreter"] and case["ok"] and case["max_err"]["grad_hidden"] < case["tolerance"]
    (grpo,) = [c for c in secs["grpo"]["cases"] if c["case"] == "qwen2.5-shape-tiny"]
    assert grpo["step_s"] and grpo["update_s"] and grpo["predicted_allocated_peak"] > 0
    assert grpo["memory"].startswith("skipped")
    skipped = {c["case"] for c in secs["grpo"]["cases"] if "skipped" in c}
    for mod, case in (("vllm", "vllm engine"), ("bitsandbytes", "qlora (nf4)")):
        assert (mod in secs["env"]["missing"]) == (case in skipped)
    assert "tinyrl gpu_check on cpu" in r.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_planner_within_25_percent_of_max_memory_allocated(tmp_path):
    gc = load_gpu_check()
    from tinyrl.planner import ARCHITECTURES

    ctx = {"device": "cuda", "root": str(tmp_path), "cpu": False}
    over = {"rollout.max_new_tokens": 64, "train.steps": 2, "train.prompts_per_step": 4, "rollout.num_generations": 8,
            "train.micro_batch_size": 16, "model.dtype": "bfloat16", "lora.r": 16}
    model = gc.random_model(ARCHITECTURES["qwen2.5-0.5b-instruct"], str(tmp_path), torch.bfloat16, "cuda")
    res = gc.grpo_case("qwen2.5-0.5b-shape", model, over, ctx)
    assert abs(res["error_pct"]) < 25, res


def test_dry_run_lists_every_check_within_eight_minutes():
    gpu_check = load_gpu_check()
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines[1:]] == list(gpu_check.SECTIONS)
    total = sum(int(line.split()[1]) for line in lines[1:])
    assert total == sum(gpu_check.BUDGET_S.values()) <= 8 * 60 and f"budget {total} s" in lines[0]
