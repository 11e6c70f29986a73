"""``additive_chunked`` (plain torch, keys in chunks with an online softmax; the GPU route of
additive attention) against the float64 reference (:func:`attnkit.reference.additive`) and its
gradients (:func:`tests.support.grads.additive`): every mask kind, float32 and bfloat16,
forward and backward, Lq != Lk and sizes that leave partial chunks and tiles. Also: every
tensor the additive path makes is on the inputs' device (no default-device tensors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels import dispatch
from attnkit.kernels.additive import chunked
from attnkit.kernels.policy import numerics
from tests.support import grads
from tests.support.host_sync import NoHostSync
from tests.support.masks import KINDS, make_case, ref_mask

TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
SKIP = (
    "tensor_float_grad",
    "key_padding_mask_float",
    "additive_grad",
    "causal&additive_grad",
    "window&tensor_grad",
    "raw_float_grad",
)
"""Kinds with a learned bias: additive_chunked refuses them (math differentiates the bias)."""


def _inputs(batch, lq, lk, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [batch + (lq, 5), batch + (lk, 4), batch + (lk, 3), (6, 5), (6, 4), (6,)]
    xs = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    return [x.to(dtype).requires_grad_() for x in xs]


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks and tiles smaller than the inputs, so the online softmax combines several."""
    monkeypatch.setattr(chunked, "CHUNK_KEYS", 4)
    monkeypatch.setattr(chunked, "TILE_ENTRIES", 2 * 3 * 4 * 6 * 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", [k for k in KINDS if k not in SKIP])
def test_forward_and_backward_match_float64(small_chunks, kind, dtype):
    batch, lq, lk = (2, 3), 7, 11
    spec = make_case(kind, batch, lq, lk, seed=4)
    if spec is None:
        pytest.skip(f"{kind} needs more batch dims")
    xs = _inputs(batch, lq, lk, dtype)
    out = F.additive_attention(*xs, spec.mask, backend="additive_chunked")
    x64 = [x.detach().double().numpy() for x in xs]
    trace = R.additive(*x64, mask=ref_mask(spec, batch, lq, lk))
    tol = TOL[dtype]
    np.testing.assert_allclose(out.detach().double().numpy(), trace.output, atol=tol, rtol=tol)
    d_out = np.random.default_rng(0).standard_normal(trace.output.shape)
    out.backward(torch.from_numpy(d_out).to(dtype))
    want = grads.additive(trace, x64[3], x64[4], x64[5], d_out)
    for name, x in zip(("q", "k", "v", "w_q", "w_k", "w_v"), xs, strict=True):
        ref = want[name]
        scale = max(1.0, float(np.abs(ref).max()))
        err = float(np.abs(x.grad.double().numpy() - ref).max())
        assert err <= tol * 4 * scale, f"{kind}: gradient of {name} off by {err:.3g}"


def test_it_is_the_gpu_route_and_not_chosen_on_the_cpu():
    xs = _inputs((2,), 4, 6, torch.bfloat16)
    d = F.explain_dispatch(*xs[:3], kind="additive", w_q=xs[3], w_k=xs[4], w_v=xs[5])
    assert d.chosen == "math" and "CPU" in "; ".join(d.reasons["additive_chunked"])
    call = dispatch.CACHE  # noqa: F841 (explain remembers nothing)
    learned = M.from_tensor(torch.zeros(4, 6, requires_grad=True))
    d = F.explain_dispatch(*xs[:3], learned, kind="additive", w_q=xs[3], w_k=xs[4], w_v=xs[5])
    assert "learned bias" in "; ".join(d.reasons["additive_chunked"])


def test_memory_is_bounded_by_tiles_not_lq_by_lk(monkeypatch):
    """No tensor of Lq x Lk x h entries: every tanh tile has at most TILE_ENTRIES entries."""
    seen = []
    orig = torch.tanh
    monkeypatch.setattr(torch, "tanh", lambda x: seen.append(x.numel()) or orig(x))
    xs = _inputs((1,), 300, 700, torch.float32)
    monkeypatch.setattr(chunked, "TILE_ENTRIES", 6 * 64 * 20)
    monkeypatch.setattr(chunked, "CHUNK_KEYS", 64)
    F.additive_attention(*xs, backend="additive_chunked").sum().backward()
    assert seen and max(seen) <= 6 * 64 * 20 < 300 * 700 * 6


@pytest.mark.parametrize("backend", ["additive_chunked", "math"])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_additive_makes_every_tensor_on_the_inputs_device(backend, mask):
    """With torch's default device set to ``meta``, a tensor made without ``device=`` would be
    on meta and the call would fail or return meta: the CPU inputs' results must be right.
    (Mask objects build their tiles on the CPU by design and are copied to the device.)"""
    xs = _inputs((2,), 5, 6, torch.float32)
    r = torch.rand(5, 6, generator=torch.Generator().manual_seed(1))
    m = {None: None, "bool": r < 0.7, "float": torch.where(r < 0.7, r, -torch.inf)}[mask]
    want = F.additive_attention(*xs, m, backend="math")
    for path in ("device", "host"):
        with numerics.use_path(path), torch.device("meta"):
            got = F.additive_attention(*xs, m, backend=backend)
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_device_path_reads_nothing_back():
    xs = [x.detach() for x in _inputs((2,), 5, 9, torch.float32)]
    mask = torch.rand(5, 9, generator=torch.Generator().manual_seed(2)) < 0.6
    with numerics.use_path("device"):
        F.additive_attention(*xs, mask, backend="additive_chunked")
        with NoHostSync():
            out = F.additive_attention(*xs, mask, backend="additive_chunked")
    ref = F.additive_attention(*xs, mask, backend="math")
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_additive_runs_and_matches_float64(dtype):
    xs = _inputs((2,), 33, 70, dtype)
    xc = [x.detach().cuda().requires_grad_() for x in xs]
    out = F.additive_attention(*xc, M.causal())
    x64 = [x.detach().double().numpy() for x in xs]
    ref = R.additive(*x64, mask=M.causal().materialize(33, 70).numpy()).output
    tol = TOL[dtype]
    np.testing.assert_allclose(out.detach().double().cpu().numpy(), ref, atol=tol, rtol=tol)
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in xc)


@pytest.mark.parametrize(
    "dtype, mask_dtype", [(torch.float64, torch.float32), (torch.float32, torch.float16)]
)
def test_a_float_mask_narrower_than_the_inputs(dtype, mask_dtype):
    """A bias tensor in a narrower dtype than the compute dtype (a float32 mask with float64
    inputs) raised "value cannot be converted to type float without overflow" when its tiles
    were clamped to the compute dtype's range. The float64 reference, 1e-5."""
    batch, lq, lk = (2,), 5, 7
    xs = _inputs(batch, lq, lk, dtype, seed=2)
    g = torch.Generator().manual_seed(3)
    bias = torch.randn(lq, lk, generator=g, dtype=torch.float64)
    bias[1, 2:] = -torch.inf
    out = F.additive_attention(*xs, bias.to(mask_dtype), backend="additive_chunked")
    x64 = [x.detach().double().numpy() for x in xs]
    ref = R.additive(*x64, mask=bias.to(mask_dtype).double().numpy()).output
    np.testing.assert_allclose(out.detach().double().numpy(), ref, atol=1e-5, rtol=1e-5)
