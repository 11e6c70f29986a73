"""Multi-head plumbing of attnkit.functional: split_heads, merge_heads, repeat_kv_heads,
grouped_query_attention and multi_head_attention with grouped-query heads, against independent
references (float64: relative error <= 1e-10)."""

from __future__ import annotations

import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels import BACKENDS, dispatch
from attnkit.kernels.call.backend import Backend
from tests.support import masks as S
from tests.support.numerics import rel_err

TOL = 1e-10


def rand(*shape, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_(grad)


def test_split_and_merge_heads():
    x = rand(2, 7, 12)
    s = F.split_heads(x, 3)
    assert s.shape == (2, 3, 7, 4)
    for h in range(3):  # head h holds features h*4 .. h*4+3
        assert torch.equal(s[:, h], x[..., h * 4 : (h + 1) * 4])
    assert torch.equal(F.merge_heads(s), x)
    assert s.data_ptr() == x.data_ptr()  # a view, no copy


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 1, 3, 5, 4), (1, 3, 4)])
def test_repeat_kv_heads_is_repeat_interleave(shape):
    x = rand(*shape)
    g = shape[-3]
    for n in (g, 2 * g, 4 * g):
        assert torch.equal(F.repeat_kv_heads(x, n), x.repeat_interleave(n // g, dim=-3))


MASKS = {
    "none": S.none(),
    "causal": S.causal("bottom_right"),
    "key_padding": S.key_padding([9, 4]),
    "per-head tensor": S.raw(rand(1, 6, 5, 9, seed=3) > -0.5),
}
"""Catalogue masks (tests/support/masks.py) for q (2, 6, 5, d) and k/v (2, g, 9, d)."""


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("g", [1, 2, 3])
def test_grouped_query_attention_equals_repeated_heads(mask_name, g):
    """Output, weights and gradients equal attention over explicitly repeated k/v heads."""
    mask = MASKS[mask_name].mask
    q = rand(2, 6, 5, 4, seed=1, grad=True)
    k, v = rand(2, g, 9, 4, seed=2, grad=True), rand(2, g, 9, 3, seed=4, grad=True)
    out, w = F.grouped_query_attention(q, k, v, mask, return_weights=True)
    kr, vr = k.repeat_interleave(6 // g, 1), v.repeat_interleave(6 // g, 1)
    ref_out, ref_w = F.scaled_dot_product_attention(q, kr, vr, mask, return_weights=True)
    assert rel_err(out, ref_out) <= TOL and rel_err(w, ref_w) <= TOL
    go = rand(*out.shape, seed=5)
    grads = torch.autograd.grad(out, (q, k, v), go)
    ref = torch.autograd.grad(ref_out, (q, k, v), go)
    for a, b in zip(grads, ref, strict=True):
        assert rel_err(a, b) <= TOL


class NativeGQA(Backend):
    """A stand-in backend that declares ``supports_gqa`` and runs SDPA's enable_gqa."""

    name = "native_gqa"
    kinds = ("dot",)
    dtypes = (torch.float64,)
    supports_gqa = True
    seen: list = []

    def extra_reasons(self, call):
        return [] if call.mask is None else ["no mask in this test backend"]

    def run(self, call, decision):
        self.seen.append(tuple(call.k.shape))
        out = torch.nn.functional.scaled_dot_product_attention(
            call.q, call.k, call.v, scale=call.scale, enable_gqa=True
        )
        return out, None


def test_backend_with_supports_gqa_gets_k_and_v_without_copies(monkeypatch):
    b = NativeGQA()
    monkeypatch.setitem(BACKENDS, b.name, b)
    monkeypatch.setitem(dispatch.PREFERENCE, "dot", (b.name, "dense", "math"))
    dispatch.clear_cache()
    q, k, v = rand(2, 6, 5, 4, seed=1), rand(2, 2, 9, 4, seed=2), rand(2, 2, 9, 3, seed=3)
    out = F.grouped_query_attention(q, k, v)
    assert b.seen == [(2, 2, 9, 4)]  # G = 2 heads reached the backend
    kr, vr = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
    ref = F.scaled_dot_product_attention(q, kr, vr, backend="math")
    assert rel_err(out, ref) <= TOL
    F.grouped_query_attention(q, k, v, M.causal())  # a backend without it gets repeated heads
    assert len(b.seen) == 1
    dispatch.clear_cache()


@pytest.mark.parametrize("g", [1, 2, 4])
def test_multi_head_attention_grouped_query_equals_reference(g):
    """num_kv_heads = G against the float64 reference with each k/v head's weights repeated."""
    h, e, dk, dv, b, lq, lk = 4, 8, 3, 2, 2, 5, 7
    x, y = rand(b, lq, e, seed=1), rand(b, lk, e, seed=2)
    wq, wk, wv = rand(h * dk, e, seed=3), rand(g * dk, e, seed=4), rand(g * dv, e, seed=5)
    wo = rand(e, h * dv, seed=6)
    mask = torch.rand(b, 1, lq, lk, generator=torch.Generator().manual_seed(7)) > 0.3
    out, w = F.multi_head_attention(
        x, y, y, h, wq, wk, wv, wo, mask=mask, num_kv_heads=g, return_weights=True
    )

    def per_head(wt, d):  # (G*d, E) -> the (H*d, E) weight whose head i is G-head i // (H/G)
        return wt.reshape(g, d, e).repeat_interleave(h // g, 0).reshape(h * d, e)

    ref = R.multi_head(
        x.numpy(), y.numpy(), wq.T.numpy(), per_head(wk, dk).T.numpy(),
        per_head(wv, dv).T.numpy(), wo.T.numpy(), h, mask=mask.numpy(),
    )  # fmt: skip
    assert rel_err(out, ref.output) <= TOL
    assert rel_err(w, ref.weights) <= TOL
