"""Bottom-right causal attention with Lq < Lk on the CPU (``kernels/causal_chunk.py``, through
the dense backend): outputs against the float64 reference, gradients against the math backend
in float64, odd sizes, Lq = 1 and Lk - 1, layouts and dtypes; no (Lq, Lk) mask is built."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference
from attnkit.kernels import causal_chunk, dense

TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}
MASK = M.causal("bottom_right")


def _inputs(b, h, lq, lk, d, dtype, seed, transposed=False):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, h, lq, d), (b, h, lk, d), (b, h, lk, d)]
    out = []
    for s in shapes:
        t = torch.randn(s, generator=g, dtype=torch.float64)
        if transposed:  # (B, L, H, d) memory, as split heads leave it
            t = t.transpose(1, 2).contiguous().transpose(1, 2)
        out.append(t.to(dtype).requires_grad_())
    return out


def _want(q, k, v):
    lq, lk = q.shape[-2], k.shape[-2]
    allowed = MASK.materialize(lq, lk).numpy()
    args = (t.detach().double().numpy() for t in (q, k, v))
    return torch.from_numpy(reference.scaled_dot_product(*args, mask=allowed).output.copy())


@pytest.fixture
def no_materialised_mask(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the CPU path built causal_lower_right's mask")

    monkeypatch.setattr(dense, "causal_lower_right", refuse)


@settings(max_examples=30, deadline=None)
@given(
    lq=st.integers(1, 40),
    extra=st.integers(1, 40),
    d=st.sampled_from([1, 8, 13]),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]),
    transposed=st.booleans(),
)
def test_forward_matches_float64(lq, extra, d, dtype, transposed):
    q, k, v = _inputs(2, 3, lq, lq + extra, d, dtype, lq * 41 + extra, transposed)
    assert causal_chunk.applies(q, k, v, 0.0)
    out = F.scaled_dot_product_attention(q, k, v, MASK, backend="dense")
    assert out.dtype == dtype and out.shape == q.shape
    err = (out.double() - _want(q, k, v)).abs().max()
    assert err <= TOL[dtype], (err, dtype)


@pytest.mark.parametrize("lq, lk", [(1, 2), (1, 64), (7, 8), (17, 100), (64, 65)])
def test_gradients_match_the_math_backend_in_float64(lq, lk, no_materialised_mask):
    q, k, v = _inputs(1, 2, lq, lk, 8, torch.float64, lq + lk, transposed=lq % 2 == 1)
    out = F.scaled_dot_product_attention(q, k, v, MASK, backend="dense")
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), go)
    want = torch.autograd.grad(
        F.scaled_dot_product_attention(q, k, v, MASK, backend="math"), (q, k, v), go
    )
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max() <= 1e-10


def test_float32_gradients_and_auto_dispatch(no_materialised_mask):
    q, k, v = _inputs(2, 4, 33, 160, 16, torch.float32, 3)
    out = F.scaled_dot_product_attention(q, k, v, MASK)
    out.sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(q64, k64, v64, MASK, backend="math").sum().backward()
    for a, b in ((q, q64), (k, k64), (v, v64)):
        assert (a.grad.double() - b.grad).abs().max() <= 1e-4
    assert (out.double() - _want(q, k, v)).abs().max() <= 2e-5


def test_cases_it_leaves_to_causal_lower_right():
    q, k, v = _inputs(1, 2, 5, 9, 8, torch.float32, 0)
    assert not causal_chunk.applies(q, k, v, 0.1)  # dropout
    assert not causal_chunk.applies(q, k[:, :1], v[:, :1], 0.0)  # grouped heads
    assert not causal_chunk.applies(q, q, q, 0.0)  # Lq == Lk: SDPA's is_causal serves it
    assert not causal_chunk.applies(q[0], k[0], v[0], 0.0)  # 3 dims
    v5 = v[..., :5]
    assert not causal_chunk.applies(q, k, v5, 0.0)  # dv != dk: one head size in the fused ops
    out = F.scaled_dot_product_attention(q, k, v5, MASK, backend="dense")
    assert (out.double() - _want(q, k, v5)).abs().max() <= 2e-5
    # dropout aside, those go through causal_lower_right and still match the reference
    out = F.scaled_dot_product_attention(q, q, q, MASK, backend="dense")
    assert (out.double() - _want(q, q, q)).abs().max() <= 2e-5


def test_expanded_keys_stride_zero(no_materialised_mask):
    """k and v of one head expanded over the heads (stride 0): the fused ops read them as is."""
    q, k, v = _inputs(1, 3, 6, 11, 8, torch.float32, 5)
    kk, vv = k[:, :1].expand_as(k), v[:, :1].expand_as(v)
    assert causal_chunk.applies(q, kk, vv, 0.0)
    out = F.scaled_dot_product_attention(q, kk, vv, MASK, backend="dense")
    assert (out.double() - _want(q, kk, vv)).abs().max() <= 2e-5
