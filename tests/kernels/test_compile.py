"""Every Triton kernel compiled ahead of time for the cards tinyrl serves (T4, A100, 3090/A10, 4090/L4,
H100), at every dtype each runs and every block configuration the dispatcher can pick, with the
`ptxas` Triton ships: no compile error, shared memory within the card's limit, no register spill.
No GPU is needed. The compile runs in a fresh process: this folder's conftest turns on the Triton
interpreter, which replaces the compiler."""

import json
import os
import subprocess
import sys

import pytest

from tinyrl.kernels import configs


def compile_check(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, said out loud (it warns otherwise)
    return subprocess.run([sys.executable, "-m", "tinyrl.kernels.compile_check", *args], capture_output=True,
                          text=True, env=env, timeout=1200)


@pytest.mark.slow  # ~1-2 min of compiling on 2 cores; the README's test command runs it
def test_every_kernel_compiles_for_every_card_without_spills():
    out = compile_check("--json")
    rows = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else []
    assert rows, out.stderr[-3000:]
    problems = [(r["kernel"], r["card"], r["dtype"], r["config"], r["problems"]) for r in rows if r["problems"]]
    assert problems == [] and out.returncode == 0, problems or out.stderr[-3000:]
    seen = {(r["kernel"], r["capability"], r["dtype"]) for r in rows}
    for cc in configs.CAPABILITIES:
        for dtype in configs.dtypes_for(cc):
            assert {("logprobs_fwd", cc, dtype), ("logprobs_dz", cc, dtype)} <= seen
        assert {r["config"] for r in rows if r["kernel"] == "grouped_advantage" and r["capability"] == cc} == \
            {f"N{n} B{b} w{configs.ADVANTAGE_WARPS}" for n, b in configs.advantage_blocks()}
    assert all(0 < r["occupancy"] <= 1 and r["registers"] <= 255 for r in rows)


def test_the_check_sees_a_spill():
    """The tile the dispatcher used for every card before per-card configs: on a T4 it spills kilobytes."""
    code = ("from tinyrl.kernels import compile_check as c, configs, triton_logprobs as tk\n"
            "b = configs.Blocks(64, 128, 64, 8)\n"
            "r = c.check('logprobs_fwd', tk._fwd_kernel, '*fp16', dict(HAS_BIAS=True, IEEE=False, BLOCK_M=64, "
            "BLOCK_V=128, BLOCK_K=64), c.CARDS[75], b, 'fp16')\n"
            "print(r.spill_stores, r.problems)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    stores, problems = out.stdout.split(" ", 1)
    assert int(stores) > 1000 and "spills" in problems


def test_each_card_gets_its_own_blocks():
    assert configs.logprob_blocks("logprobs_fwd", 80, "bf16") == configs.Blocks(64, 128, 32, 8, 3)
    assert configs.logprob_blocks("logprobs_fwd", 90, "bf16") == configs.logprob_blocks("logprobs_fwd", 80, "bf16")
    assert configs.logprob_blocks("logprobs_fwd", 75, "fp16").m < 64  # a T4 takes smaller tiles
    assert configs.logprob_blocks("logprobs_fwd", 75, "fp32") == configs.logprob_blocks("logprobs_fwd", 89, "fp32")
    assert configs.dtypes_for(75) == ("fp16", "fp32") and "bf16" in configs.dtypes_for(80)
    assert [configs.advantage_block_n(n) for n in (1, 16, 17, 100, 10_000)] == [16, 16, 32, 128, 128]
