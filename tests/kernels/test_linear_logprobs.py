"""linear_logprobs: chunked torch path and Triton kernels vs materialised logits (fp64 gold)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from conftest import assert_three_way, max_err, tol_of

import tinyrl.kernels as K
from tinyrl.kernels.torch_logprobs import naive_linear_logprobs, torch_linear_logprobs


def make(M, H, V, dtype, bias=True, ignore=True, device="cpu"):
    """Inputs with logits of O(1-5) spread (a peaked but not degenerate softmax)."""
    h = torch.randn(M, H, dtype=torch.float64) / math.sqrt(H) * 3
    w = torch.randn(V, H, dtype=torch.float64)
    b = torch.randn(V, dtype=torch.float64) * 0.5 if bias else None
    t = torch.randint(0, V, (M,))
    if ignore:
        t[torch.rand(M) < 0.2] = -100
    g = torch.randn(M, dtype=torch.float64)
    cast = lambda x: None if x is None else x.to(device=device, dtype=dtype)  # noqa: E731
    return cast(h), cast(w), cast(b), t.to(device), g.to(device)


def run(fn, h, w, b, t, g, temperature, **kw):
    """-> (logp, entropy, grad_hidden, grad_weight, grad_bias) of sum(g * logp)."""
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    b = b.detach().requires_grad_() if b is not None else None
    logp, ent = fn(h, w, t, bias=b, temperature=temperature, **kw)
    (logp * g.to(logp.dtype)).sum().backward()
    return logp, ent, h.grad, w.grad, (b.grad if b is not None else None)


NAMES = ("logp", "entropy", "grad_hidden", "grad_weight", "grad_bias")


def check_three_way(fn, dtype, device, temperature, bias, M=37, H=24, V=300, **kw):
    h, w, b, t, g = make(M, H, V, dtype, bias=bias, device=device)
    up = lambda x: None if x is None else x.double()  # noqa: E731
    gold = run(naive_linear_logprobs, up(h), up(w), up(b), t, g, temperature)
    ref = run(lambda *a, **k: naive_linear_logprobs(*a, upcast=False, **k), h, w, b, t, g, temperature)
    out = run(fn, h, w, b, t, g, temperature, **kw)
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.float32
    for name, o, r, gd in zip(NAMES, out, ref, gold):
        if gd is not None:
            assert_three_way(name, o.cpu(), r.cpu(), gd.cpu(), dtype)
    # ignored targets: logp 0 and no gradient through that row
    ign = t < 0
    assert (out[0][ign] == 0).all() and (out[2][ign] == 0).all()


# --------------------------------------------------------------------------- torch chunked path


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_torch_chunked_equals_naive_fp64(temperature, bias):
    """In fp64 the chunked algorithm (online lse, tile recompute) is exact up to rounding."""
    h, w, b, t, g = make(37, 24, 300, torch.float64, bias=bias)
    gold = run(naive_linear_logprobs, h, w, b, t, g, temperature)
    # chunk and tile sizes that divide neither M nor V
    out = run(torch_linear_logprobs, h, w, b, t, g, temperature, chunk_size=8, vocab_tile=64)
    for name, o, gd in zip(NAMES, out, gold):
        if gd is not None:
            assert max_err(o, gd) < tol_of(torch.float64, gd), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_chunked_three_way(dtype):
    check_three_way(torch_linear_logprobs, dtype, "cpu", 0.7, True, chunk_size=16, vocab_tile=128)


def test_entropy_is_the_tempered_softmax_entropy_and_detached():
    h, w, _, t, _ = make(20, 16, 50, torch.float64, bias=False, ignore=False)
    logp, ent = K.linear_logprobs(h.requires_grad_(), w, t, temperature=1.3, impl="torch")
    p = torch.softmax((h @ w.t()) / 1.3, -1)
    assert not ent.requires_grad and logp.requires_grad
    assert torch.allclose(ent, -(p * p.log()).sum(-1), atol=1e-10)
    assert (ent >= 0).all() and (ent <= math.log(50) + 1e-9).all()


def test_frozen_weight_gets_no_grad_and_hidden_grad_is_right():
    h, w, _, t, g = make(30, 16, 70, torch.float64, bias=False)
    hg = h.clone().requires_grad_()
    logp, _ = K.linear_logprobs(hg, w, t, impl="torch", chunk_size=7)
    (logp * g).sum().backward()
    gold = run(naive_linear_logprobs, h, w, None, t, g, 1.0)
    assert w.grad is None
    assert max_err(hg.grad, gold[2]) < 1e-10


def test_leading_dims_and_chunk_size_invariance():
    h, w, b, t, _ = make(24, 16, 90, torch.float32)
    a, ea = K.linear_logprobs(h.view(4, 6, 16), w, t.view(4, 6), bias=b, chunk_size=5, impl="torch")
    c, ec = K.linear_logprobs(h, w, t, bias=b, chunk_size=1024, impl="torch")
    assert a.shape == (4, 6) and ea.shape == (4, 6)
    assert torch.allclose(a.reshape(-1), c, atol=1e-5) and torch.allclose(ea.reshape(-1), ec, atol=1e-5)


def test_autograd_saves_no_logits():
    """The memory claim: nothing of size [M, V] is kept for backward (only inputs + per-row lse)."""
    M, H, V = 64, 8, 512
    h, w, b, t, _ = make(M, H, V, torch.float32)
    h.requires_grad_()
    w.requires_grad_()
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: sizes.append(x.numel()) or x, lambda x: x):
        logp, _ = K.linear_logprobs(h, w, t, bias=b, impl="torch", chunk_size=16)
    assert max(sizes) <= max(M * H, V * H) < M * V
    with torch.autograd.graph.saved_tensors_hooks(lambda x: sizes.append(x.numel()) or x, lambda x: x):
        naive_linear_logprobs(h, w, t, bias=b)
    assert max(sizes) >= M * V  # the naive path does keep [M, V] logits: the hook sees them


# --------------------------------------------------------------------------- dispatch and imports


def test_resolve_impl(monkeypatch):
    assert K.resolve_impl("auto", "cpu") == "torch"
    assert K.resolve_impl("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="impl must be"):
        K.resolve_impl("cuda", "cpu")
    monkeypatch.setattr(K, "HAS_TRITON", False)
    with pytest.raises(ImportError, match=r"tinyrl-rlvr\[kernels\]"):
        K.resolve_impl("triton", "cpu")
    assert K.resolve_impl("auto", "cuda") == "torch"  # no triton: CUDA falls back to the torch path


def test_import_does_not_import_triton():
    code = "import sys, tinyrl.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- Triton kernels


def triton_fn(h, w, t, bias=None, temperature=1.0):
    return K.linear_logprobs(h, w, t, bias=bias, temperature=temperature, impl="triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature,bias", [(1.0, False), (0.7, True)])
def test_triton_three_way(triton_device, dtype, temperature, bias):
    check_three_way(triton_fn, dtype, triton_device, temperature, bias, M=37, H=40, V=200)


def test_triton_vocab_splits_and_backward_blocks(triton_device, monkeypatch):
    """Forward with several vocab splits; backward over several [row, vocab] dz blocks; fp64 gold."""
    import tinyrl.kernels.triton_logprobs as TL

    h, w, b, t, g = make(50, 24, 250, torch.float32, device=triton_device)
    gold = run(naive_linear_logprobs, h.double(), w.double(), b.double(), t, g, 0.9)
    for splits in (1, 3, 100):  # 100 is clamped to the number of vocab tiles
        logp, ent, _ = TL.triton_forward(h, w, b, t, 0.9, splits=splits)
        for name, o, gd in (("logp", logp, gold[0]), ("entropy", ent, gold[1])):
            assert max_err(o.cpu(), gd.cpu()) < tol_of(torch.float32, gd), (name, splits)
    monkeypatch.setattr(TL, "ROW_CHUNK", 24)  # 3 row blocks
    monkeypatch.setattr(TL, "VOCAB_CHUNK", 96)  # 3 vocab blocks
    out = run(triton_fn, h, w, b, t, g, 0.9)
    for name, o, gd in zip(NAMES, out, gold):
        assert max_err(o.cpu(), gd.cpu()) < tol_of(torch.float32, gd), name
