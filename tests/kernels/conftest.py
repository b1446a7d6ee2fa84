"""Kernel tests: seeded random inputs, three-way checks, Triton under the interpreter on CPU.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at collection. If
something imported triton earlier in this pytest process (on a machine without CUDA), the
`triton_device` fixture reruns that one test in a fresh process with the interpreter on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest
import torch

_HAS_CUDA = torch.cuda.is_available()
_TRITON_PRELOADED = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tinyrl.kernels import HAS_TRITON  # noqa: E402

# error allowed against the fp64 gold, relative to the gold's largest magnitude
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def seed(request):
    """A fixed seed per test, derived from its id, so a failure reproduces; TINYRL_TEST_SEED=N
    overrides it (to try other inputs: `TINYRL_TEST_SEED=$RANDOM pytest tests/kernels`)."""
    s = int(os.environ.get("TINYRL_TEST_SEED") or zlib.crc32(request.node.nodeid.encode()))
    torch.manual_seed(s)
    print(f"seed={s}")
    return s


@pytest.fixture
def triton_device(request):
    """The device Triton tests run on: cuda, or cpu under TRITON_INTERPRET=1."""
    if not HAS_TRITON:
        pytest.skip("triton not installed: pip install 'tinyrl-rlvr[kernels]'")
    if _HAS_CUDA:
        return "cuda"
    if not _TRITON_PRELOADED:
        return "cpu"
    if os.environ.get("TINYRL_TRITON_SUBPROCESS"):
        pytest.fail("TRITON_INTERPRET is not active even in a fresh process")
    env = dict(os.environ, TRITON_INTERPRET="1", TINYRL_TRITON_SUBPROCESS="1")
    node = f"{request.node.path}::{request.node.name}"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node], env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail(f"failed in a fresh TRITON_INTERPRET=1 process:\n{r.stdout[-4000:]}{r.stderr[-2000:]}")
    pytest.skip("passed in a fresh TRITON_INTERPRET=1 process (triton was imported before this conftest)")


def tol_of(dtype, gold: torch.Tensor) -> float:
    """The dtype's tolerance, relative to the gold's largest magnitude (at least 1)."""
    return TOL[dtype] * max(1.0, float(gold.detach().double().abs().max())) if gold.numel() else TOL[dtype]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def assert_three_way(name: str, kernel: torch.Tensor, torch_dt: torch.Tensor, gold: torch.Tensor, dtype):
    """kernel vs fp64 gold: within the dtype's tolerance, or no worse than 2x torch in that dtype."""
    assert kernel.shape == gold.shape, (name, kernel.shape, gold.shape)
    assert torch.isfinite(kernel).all(), f"{name}: non-finite values"
    tol = tol_of(dtype, gold)
    e_k, e_t = max_err(kernel, gold), max_err(torch_dt, gold)
    assert e_k <= max(tol, 2.0 * e_t), f"{name} {dtype}: kernel err {e_k:.3g}, torch err {e_t:.3g}, tol {tol:.3g}"
