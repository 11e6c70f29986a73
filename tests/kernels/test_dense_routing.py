"""Which SDPA arguments the dense backend passes (a spy on ``F.scaled_dot_product_attention``),
and that each route equals the float64 reference: causal masks are never materialised by
attnkit (top-left: ``is_causal=True``; bottom-right with Lq <= Lk: ``causal_lower_right``, or on
the CPU with Lq < Lk and one head count, no SDPA call: ``kernels/causal_chunk.py``), grouped
k/v heads run on ``enable_gqa=True`` without a repeat."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels import dense
from attnkit.kernels.policy import numerics

TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


class SdpaSpy:
    """Records the keyword arguments of the SDPA calls of the dense backend (its module's
    ``F``, so torch's own dispatch of ``CausalBias`` still sees the real function)."""

    def __init__(self, monkeypatch):
        self.calls: list[dict] = []
        self.depth = 0
        orig = torch.nn.functional.scaled_dot_product_attention

        def spy(q, k, v, attn_mask=None, **kw):
            if self.depth == 0:
                self.calls.append(dict(kw, attn_mask=attn_mask, k_heads=k.shape[-3]))
            self.depth += 1
            try:
                return orig(q, k, v, attn_mask=attn_mask, **kw)
            finally:
                self.depth -= 1

        monkeypatch.setattr(dense, "F", types.SimpleNamespace(scaled_dot_product_attention=spy))


def _qkv(h, g, lq, lk, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, h, lq, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, g, lk, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _ref(q, k, v, mask, lq, lk):
    h = q.shape[-3]
    kr, vr = (t.double().repeat_interleave(h // t.shape[-3], -3).numpy() for t in (k, v))
    allowed = None if mask is None else mask.materialize(lq, lk).numpy()
    return R.scaled_dot_product(q.double().numpy(), kr, vr, allowed).output


@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "mask, lq, lk, want",
    [
        (None, 7, 7, "plain"),
        (M.causal(), 7, 7, "is_causal"),
        (M.causal(), 5, 9, "is_causal"),
        (M.causal("bottom_right"), 5, 9, "lower_right"),
        (M.causal("bottom_right"), 1, 33, "lower_right"),  # a decode step against a cache
    ],
)
@pytest.mark.parametrize("groups", [8, 2])
def test_sdpa_arguments_and_results(monkeypatch, path, dtype, mask, lq, lk, want, groups):
    spy = SdpaSpy(monkeypatch)
    q, k, v = _qkv(8, groups, lq, lk, dtype)
    with numerics.use_path(path):
        out = F.grouped_query_attention(q, k, v, mask, backend="dense")
    ref = _ref(q, k, v, mask, lq, lk)
    if want == "lower_right" and groups == 8:  # CPU: kernels/causal_chunk.py, no SDPA call
        assert spy.calls == []
        np.testing.assert_allclose(out.double().numpy(), ref, atol=TOL[dtype], rtol=TOL[dtype])
        return
    (kw,) = spy.calls
    assert kw["k_heads"] == groups  # k/v never repeated
    assert kw.get("enable_gqa", False) == (groups < 8)
    attn = kw["attn_mask"]
    if want == "plain":
        assert attn is None and not kw.get("is_causal", False)
    elif want == "is_causal":
        assert attn is None and kw["is_causal"] is True
    else:
        assert isinstance(attn, CausalBias) and attn.variant == CausalVariant.LOWER_RIGHT
        assert not kw.get("is_causal", False)
    np.testing.assert_allclose(out.double().numpy(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_bottom_right_with_more_queries_than_keys_keeps_empty_rows_zero(monkeypatch):
    """Lq > Lk leaves rows without a key: a materialised mask, and those rows give 0."""
    spy = SdpaSpy(monkeypatch)
    q, k, v = _qkv(2, 2, 9, 4, torch.float32)
    mask = M.causal("bottom_right")
    out = F.scaled_dot_product_attention(q, k, v, mask, backend="dense")
    assert not isinstance(spy.calls[0]["attn_mask"], CausalBias)
    assert torch.equal(out[..., :5, :], torch.zeros_like(out[..., :5, :]))
    np.testing.assert_allclose(out.double().numpy(), _ref(q, k, v, mask, 9, 4), atol=2e-6)


def test_causal_gradients_match_float64(monkeypatch):
    q, k, v = (t.requires_grad_() for t in _qkv(4, 2, 6, 10, torch.float32, seed=3))
    mask = M.causal("bottom_right")
    out = F.grouped_query_attention(q, k, v, mask, backend="dense")
    out.backward(torch.ones_like(out))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    kr, vr = (t.repeat_interleave(2, 1) for t in (kd, vd))
    ref = torch.nn.functional.scaled_dot_product_attention(
        qd, kr, vr, attn_mask=mask.materialize(6, 10)
    )
    ref.backward(torch.ones_like(ref))
    for got, want in ((q, qd), (k, kd), (v, vd)):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scale", [0.0, -0.5, 1e-300])
@pytest.mark.parametrize(
    "mask, lq, lk",
    [(M.causal(), 6, 6), (M.causal(), 5, 9), (M.causal("bottom_right"), 7, 7)],
)
def test_causal_with_a_scale_not_above_zero_matches_float64(mask, lq, lk, scale):
    """SDPA's CPU kernel applies ``is_causal`` before the scale: a scale of 0 (1e-300 is 0 in its
    float32 accumulator) turned the masked scores into NaN and a negative one into +inf (torch
    2.13), so such calls take the mask as a tensor. The float64 reference, 1e-12."""
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
        q, k, v = _qkv(2, 2, lq, lk, dtype, seed=5)
        out = F.scaled_dot_product_attention(q, k, v, mask, scale=scale, backend="dense")
        qd, kd, vd = (t.double().numpy() for t in (q, k, v))
        ref = R.scaled_dot_product(qd, kd, vd, mask.materialize(lq, lk).numpy(), scale=scale)
        np.testing.assert_allclose(out.double().numpy(), ref.output, atol=tol, rtol=0)
