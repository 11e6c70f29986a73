"""The ``blocksparse`` backend's plans (band, docs, rows; cached on the mask) and the
dispatcher's choice and reasons for sparse and dense masks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import attnkit.kernels.blocksparse as bs
from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference
from attnkit.kernels.blocksparse import plans
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.tuning import DEFAULT, use


@pytest.fixture(autouse=True)
def xeon_rule():
    """The rule these tests pin down is the one measured on the project's Xeon (MIN_EMPTY 0.2
    there); the built-in default's own value is checked in test_dispatch_tuning.py."""
    with use(dataclasses.replace(DEFAULT, blocksparse_min_empty=0.2)):
        yield


def _sorted_ids(n, ndoc, g):
    return torch.sort(torch.randint(0, ndoc, (n,), generator=g)).values


# ---------------------------------------------------------------------------------------------
# plans and dispatch
# ---------------------------------------------------------------------------------------------
def _call(mask, lq=1025, lk=None, batch=(1, 2), d=16, dtype=torch.float32):
    lk = lq if lk is None else lk
    q = torch.zeros(batch + (lq, d), dtype=dtype)
    k = torch.zeros(batch + (lk, d), dtype=dtype)
    return AttentionCall("dot", q, k, k, mask=mask, scale=1.0)


def test_plan_kinds_and_plan_cache_on_the_mask():
    g = torch.Generator().manual_seed(0)
    ids = _sorted_ids(1025, 6, g)
    assert bs.make_plan(_call(M.sliding_window(64))).kind == "band"
    assert bs.make_plan(_call(M.sliding_window(64) & M.causal())).kind == "band"
    assert bs.make_plan(_call(M.document(ids))).kind == "docs"
    plan = bs.make_plan(_call(M.document(ids) & M.causal()))
    assert plan.kind == "docs" and all(c.is_causal for c in plan.calls)
    assert bs.make_plan(_call(M.key_padding([1000]), batch=(1, 2))).kind == "rows"
    m = M.key_padding([100, 900]) & M.causal()
    p1 = bs.make_plan(_call(m, batch=(2, 3)))
    assert bs.make_plan(_call(m, batch=(2, 3))) is p1  # reused for a new call of the same shape
    assert bs.make_plan(_call(m, batch=(2, 3), dtype=torch.float64)) is not p1


def _explain(mask, lq=1025, dtype=torch.float32, **kw):
    q = torch.zeros((1, 2, lq, 16), dtype=dtype)
    return F.explain_dispatch(q, q, q, mask, **kw)


def test_dispatch_picks_blocksparse_for_sparse_masks():
    g = torch.Generator().manual_seed(0)
    for mask in (
        M.sliding_window(64),
        M.sliding_window(64) & M.causal(),
        M.causal("bottom_right"),
        M.document(_sorted_ids(1025, 8, g)),
        M.prefix_lm(100),
    ):
        d = _explain(mask)
        assert d.chosen == "blocksparse", (mask, d)


def test_dispatch_reasons_for_dense_cases():
    r = _explain(None).reasons["blocksparse"]
    assert any("no mask" in x for x in r), r
    d = _explain(M.causal())
    assert d.chosen == "dense" and any("is_causal" in x for x in d.reasons["blocksparse"])
    r = _explain(M.sliding_window(2000)).reasons["blocksparse"]
    assert any("no 128x64 block empty" in x for x in r), r
    d = _explain(M.sliding_window(600))  # about 10% of the blocks empty
    assert d.chosen == "dense"
    assert any("leaves only" in x and "(< 20%)" in x for x in d.reasons["blocksparse"]), d
    r = _explain(M.sliding_window(64), return_weights=True).reasons["blocksparse"]
    assert any("weights" in x for x in r), r
    assert _explain(M.sliding_window(64), dropout_p=0.1).chosen == "blocksparse"  # issue 12
    q = torch.zeros((1, 2, 64, 16))
    with pytest.raises(ValueError, match="no mask"):
        F.scaled_dot_product_attention(q, q, q, backend="blocksparse")


# ---------------------------------------------------------------------------------------------
# the band's query block without gradients (blocksparse_band_block_q)
# ---------------------------------------------------------------------------------------------
def _qkv(lq, lk, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 3, n, 16, generator=g, dtype=torch.float64) for n in (lq, lk, lk))
    return [t.float().requires_grad_(requires_grad) for t in (q, k, v)]


def test_band_rows_without_and_with_gradients():
    t = dataclasses.replace(
        DEFAULT,
        blocksparse_block_q=128,
        blocksparse_band_block_q=16,
        blocksparse_band_backward_block_q=64,
    )
    q, k, v = _qkv(300, 300)
    qg, kg, vg = _qkv(300, 300, requires_grad=True)

    def rows(mask, *qkv, softcap=None):
        return bs.block_rows(AttentionCall("dot", *qkv, mask=mask, scale=1.0, softcap=softcap), t)

    assert rows(M.sliding_window(8), q, k, v) == 16
    assert rows(M.sliding_window(8) & M.causal(), q, k, v) == 16
    assert rows(M.sliding_window(8), qg, kg, vg) == 64  # the backward's own block
    assert rows(M.sliding_window(8), q, k, v, softcap=30.0) == 128  # the softcap's own tiles
    assert rows(M.key_padding([100]), q, k, v) == 128  # not a band
    assert rows(None, q, k, v) == 128
    small = dataclasses.replace(t, blocksparse_block_q=16, blocksparse_band_block_q=64)
    call = AttentionCall("dot", q, k, v, mask=M.sliding_window(8), scale=1.0)
    assert bs.block_rows(call, small) == 16  # never above blocksparse_block_q


@pytest.mark.parametrize("rows", [8, 16, 32, 128])
@pytest.mark.parametrize(
    "mask",
    [
        M.sliding_window(5),
        M.sliding_window(40) & M.causal(),
        M.sliding_window(33, 0, "bottom_right"),
    ],
    ids=["window 5", "causal window 40", "bottom-right causal window 33"],
)
@pytest.mark.parametrize("lq,lk", [(257, 257), (200, 333)])
@pytest.mark.parametrize("per_element", [False, True], ids=["one call", "a call per element"])
def test_band_forward_matches_the_reference_at_every_band_block(
    rows, mask, lq, lk, per_element, monkeypatch
):
    """Interior windows and edge blocks at every block size, odd lengths, Lq != Lk, the interior
    as one fused call or one per batch element: against the float64 reference of the same
    inputs (absolute floor: float32 accumulation, |out| <= 4)."""
    monkeypatch.setattr(plans, "BLOCKS_AS_BATCH", 1 if per_element else 10**9)
    q, k, v = _qkv(lq, lk, seed=rows + lq)
    with use(dataclasses.replace(DEFAULT, blocksparse_band_block_q=rows)), torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
    allowed = mask.materialize(lq, lk).numpy()
    want = reference.scaled_dot_product(
        *(t.double().numpy() for t in (q, k, v)), mask=allowed
    ).output
    assert np.abs(out.double().numpy() - want).max() <= 2e-5


@pytest.mark.parametrize("per_element", [False, True], ids=["one call", "a call per element"])
def test_band_gradients_after_either_interior_forward(per_element, monkeypatch):
    """The backward reads the forward's saved output and logsumexp (a view of the output on the
    per-element route): gradients against float64 autograd of the dense reference."""
    monkeypatch.setattr(plans, "BLOCKS_AS_BATCH", 1 if per_element else 10**9)
    mask = M.sliding_window(20)
    q, k, v = _qkv(301, 301, requires_grad=True, seed=7)
    out = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
    _check_against_float64(out, q, k, v, mask, seed=1)


def _check_against_float64(out, q, k, v, mask, seed: int) -> None:
    """out and the gradients of q, k, v (for a random output gradient) against float64
    autograd of the dense softmax on the same values (absolute floors: float32 accumulation,
    |out| <= 4)."""
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad(out, (q, k, v), go)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    allowed = mask.materialize(q.shape[-2], k.shape[-2])
    s = (q64 @ k64.transpose(-2, -1)) * q.shape[-1] ** -0.5
    ref = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1) @ v64
    assert (out.double() - ref).abs().max() <= 2e-5
    want = torch.autograd.grad(ref, (q64, k64, v64), go.double())
    for got, exp in zip(grads, want, strict=True):
        assert (got.double() - exp).abs().max() <= 5e-5


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t (1, H, L, d) as the same values in another memory layout."""
    if layout == "transposed":  # (B, L, H, d) memory, as a projection's output viewed per head
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "stepped":  # every other row of a larger buffer
        return torch.repeat_interleave(t, 2, dim=2)[:, :, ::2]
    if layout == "expanded":  # one head's values expanded over the heads (stride 0)
        return t[:, :1].expand(t.shape)
    return t


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "stepped", "expanded"])
def test_per_element_band_route_reads_every_layout(layout, monkeypatch):
    """The per-element interior calls on q, k, v in other memory layouts: output and gradients
    against float64 autograd of the dense reference on the same values."""
    monkeypatch.setattr(plans, "BLOCKS_AS_BATCH", 1)
    ran = []
    per_element = plans.BandPlan._blocks_as_batch
    monkeypatch.setattr(
        plans.BandPlan, "_blocks_as_batch", lambda self, *a: ran.append(1) or per_element(self, *a)
    )
    mask = M.sliding_window(9, 0)
    q, k, v = (_layout(t.detach(), layout).requires_grad_() for t in _qkv(203, 203, seed=11))
    with use(dataclasses.replace(DEFAULT, blocksparse_block_q=16)):  # 11 interior blocks
        out = F.scaled_dot_product_attention(q, k, v, mask, backend="blocksparse")
    assert ran, "the per-element route did not run"
    _check_against_float64(out, q, k, v, mask, seed=2)


@pytest.mark.parametrize("scale", [0.0, -0.7, 1e-300])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_causal_tiles_with_a_scale_not_above_zero_match_float64(scale, with_sinks):
    """The docs plan's causal tiles ran on the fused kernel's ``is_causal``, which masks before
    it scales: a scale of 0 gave NaN rows, a negative one +inf scores (torch 2.13). Output and
    gradients against softmax in float64 with the mask as a tensor, 1e-5."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=g, requires_grad=True) for _ in range(3))
    sinks = torch.randn(2, generator=g, requires_grad=True) if with_sinks else None
    ids = torch.tensor([0] * 15 + [1] * 25)
    mask = M.document(ids) & M.causal()
    assert bs.make_plan(_call(mask, lq=40, batch=(1, 2))).kind == "docs"
    out = F.scaled_dot_product_attention(
        q, k, v, mask, scale=scale, sinks=sinks, backend="blocksparse"
    )
    out.backward(torch.ones_like(out))
    leaves = [t for t in (q, k, v, sinks) if t is not None]
    ref_in = [t.detach().double().requires_grad_() for t in leaves]
    qd, kd, vd = ref_in[:3]
    s = (qd @ kd.transpose(-2, -1) * scale).masked_fill(~mask.materialize(40, 40), -torch.inf)
    if with_sinks:
        s = torch.cat([s, ref_in[3].view(2, 1, 1).expand(1, 2, 40, 1)], -1)
    ref = torch.softmax(s, -1)[..., :40] @ vd
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(out.detach().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    for got, want in zip(leaves, ref_in, strict=True):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-5, rtol=1e-5)
