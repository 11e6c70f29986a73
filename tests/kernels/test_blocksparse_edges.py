"""The edges of band and document masks on ``blocksparse``, drawn by hypothesis: every band
(sliding windows of any left/right width, causal, window & causal) in both alignments, and
documents (sorted ids, other key ids, causal documents), at odd lengths with Lq != Lk, block
sizes that leave interior blocks and edge blocks (and documents whose boundaries fall inside a
block), grouped-query heads (G = 1, 2, 4, k and v never repeated), memory layouts, float64,
float32 and bfloat16 (where the CPU has native bf16). Outputs and the gradients of q, k and v
against the float64 NumPy reference (tests/kernels/blocksparse_check.py, tolerances of
tests/support/numerics.py); rows without a key give output 0 and gradient 0, never NaN.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from attnkit import cpu, kernels
from attnkit import functional as F
from attnkit.kernels import blocksparse as bs
from attnkit.kernels import dispatch
from attnkit.kernels.blocksparse import plans
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.tuning import DEFAULT, use
from tests.kernels.blocksparse_check import check
from tests.support import layouts
from tests.support import masks as S
from tests.support.masks import ref_mask

GROUPS = ((2, 2), (4, 2), (4, 1))  # (H, Hkv): G = 1, 2, 4
ALIGN = ("top_left", "bottom_right")
NATIVE_BF16 = bool(cpu.native_bf16())


@contextmanager
def blocks(block_q: int, block_kv: int, band_forward: int = 8):
    """``blocksparse`` with these blocks, accepting any sparsity, for the calls inside; a band
    plan's forward runs its interior in blocks of ``band_forward`` rows when that divides
    ``block_q`` (the tuning's ``blocksparse_band_block_q``)."""
    saved = kernels.BACKENDS["blocksparse"]
    kernels.BACKENDS["blocksparse"] = bs.BlocksparseBackend(block_q, block_kv, 0.0)
    dispatch.clear_cache()
    try:
        with use(replace(DEFAULT, blocksparse_band_block_q=band_forward)):
            yield
    finally:
        kernels.BACKENDS["blocksparse"] = saved
        dispatch.clear_cache()


@st.composite
def bands(draw):
    """A band spec: a window (left, right), causal, or window & causal, in either alignment."""
    kind = draw(st.sampled_from(("window", "causal", "window&causal")))
    align = draw(st.sampled_from(ALIGN))
    left = draw(st.integers(0, 20))
    right = draw(st.integers(0, 20))
    if kind == "causal":
        return S.causal(align)
    window = S.sliding_window(left, right, align)
    return window if kind == "window" else window & S.causal(align)


def _ids(draw, n: int, docs: int) -> np.ndarray:
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=docs - 1, max_size=docs - 1)))
    ids = np.zeros(n, dtype=np.int64)
    for c in cuts:
        ids[c:] += 1
    return ids


@st.composite
def documents(draw, lq: int, lk: int):
    """A document spec: sorted ids (boundaries anywhere, empty documents allowed), other key ids
    when Lq != Lk (queries of a document without keys see nothing), causal when Lq == Lk."""
    docs = draw(st.integers(1, 6))
    ids = _ids(draw, lq, docs)
    if lq == lk and draw(st.booleans()):
        spec = S.document(torch.from_numpy(ids))
        return spec & S.causal() if draw(st.booleans()) else spec
    kv = _ids(draw, lk, draw(st.integers(1, 6)))
    return S.document(torch.from_numpy(ids), torch.from_numpy(kv))


def _plan_kind(spec, h: int, g: int, lq: int, lk: int, block_q: int, block_kv: int) -> str:
    q, k = torch.zeros(2, h, lq, 8), torch.zeros(2, g, lk, 8)
    call = AttentionCall("dot", q, k, k, mask=spec.mask, scale=1.0)
    return bs.make_plan(call, block_q, block_kv).kind


def _run(spec, h, g, lq, lk, block_q, block_kv, dtype, layout, seed):
    note(f"{spec.mask!r} H={h} Hkv={g} {lq}x{lk} blocks {block_q}x{block_kv} {dtype} {layout}")
    note(f"plan: {_plan_kind(spec, h, g, lq, lk, block_q, block_kv)}")
    with blocks(block_q, block_kv):
        check(h, g, "drawn", lq=lq, lk=lk, dtype=dtype, layout=layout, seed=seed, spec=spec)


SHAPES = dict(
    lq=st.integers(1, 160),
    lk=st.integers(1, 160),
    hg=st.sampled_from(GROUPS),
    block_q=st.sampled_from((8, 16, 32)),
    block_kv=st.sampled_from((4, 8, 16)),
    layout=st.sampled_from(("contiguous", "transposed", "stepped")),
    seed=st.integers(0, 2**16),
)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(data=st.data(), dtype=st.sampled_from((torch.float64, torch.float32)), **SHAPES)
def test_bands_against_reference(data, dtype, lq, lk, hg, block_q, block_kv, layout, seed):
    spec = data.draw(bands())
    _run(spec, *hg, lq, lk, block_q, block_kv, dtype, layout, seed)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(data=st.data(), dtype=st.sampled_from((torch.float64, torch.float32)), **SHAPES)
def test_documents_against_reference(data, dtype, lq, lk, hg, block_q, block_kv, layout, seed):
    spec = data.draw(documents(lq, lk))
    _run(spec, *hg, lq, lk, block_q, block_kv, dtype, layout, seed)


@pytest.mark.skipif(not NATIVE_BF16, reason="bf16 runs only where the CPU has native bf16")
@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(data=st.data(), **SHAPES)
def test_bfloat16_bands_and_documents(data, lq, lk, hg, block_q, block_kv, layout, seed):
    spec = data.draw(st.one_of(bands(), documents(lq, lk)))
    _run(spec, *hg, lq, lk, block_q, block_kv, torch.bfloat16, layout, seed)


@pytest.mark.parametrize(
    "spec,lq,lk",
    [
        (S.causal("bottom_right"), 61, 23),  # the first 38 queries see no key
        (S.sliding_window(3, 0, "bottom_right") & S.causal("bottom_right"), 61, 23),
        (S.sliding_window(2, 5), 61, 23),  # the last rows: a window right of every key
        (S.sliding_window(0, 4, "bottom_right"), 61, 23),  # the first rows: left of every key
        (
            S.document(
                torch.tensor([0] * 20 + [1] * 21 + [2] * 20), torch.tensor([0] * 9 + [2] * 14)
            ),
            61,
            23,
        ),
    ],
    ids=["causal_br", "local_causal_br", "window_past_keys", "window_right", "doc_without_keys"],
)
@pytest.mark.parametrize("hg", GROUPS)
def test_rows_without_keys_give_zero_output_and_gradient(spec, lq, lk, hg):
    h, g = hg
    allowed = np.broadcast_to(ref_mask(spec, (2, h), lq, lk), (2, h, lq, lk))
    empty = torch.from_numpy(~allowed.any(-1))
    assert empty.any()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, h, lq, 8, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, g, lk, 8, generator=gen, requires_grad=True) for _ in range(2))
    fn = F.grouped_query_attention if g != h else F.scaled_dot_product_attention
    with blocks(8, 4):
        out = fn(q, k, v, spec.mask, backend="blocksparse")
        gq, gk, gv = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert all(torch.isfinite(t).all() for t in (out, gq, gk, gv))
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.equal(gq[empty], torch.zeros_like(gq[empty]))
    with blocks(8, 4):
        check(h, g, "rows without keys", lq=lq, lk=lk, dtype=torch.float32, spec=spec)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_band_edges_in_every_layout(layout):
    """A window whose plan has interior blocks and edge blocks at both ends, every layout."""
    spec = S.sliding_window(5, 9, "bottom_right")
    assert _plan_kind(spec, 4, 2, 97, 83, 8, 4) == "band"
    with blocks(8, 4):
        check(4, 2, "window", lq=97, lk=83, layout=layout, dtype=torch.float32, spec=spec)


@pytest.mark.parametrize("hg", GROUPS)
def test_band_edge_blocks_share_a_call_at_each_end(hg):
    """The edge blocks at either end of a band plan run as one fused call each (each call is a
    parallel region, which a loaded machine makes wait), and stay exact."""
    h, g = hg
    spec = S.sliding_window(40, 30, "bottom_right")  # 4 edge blocks at the start, 3 at the end
    q, k = torch.zeros(2, h, 203, 8), torch.zeros(2, g, 211, 8)
    plan = bs.make_plan(AttentionCall("dot", q, k, k, mask=spec.mask, scale=1.0), 8, 4)
    assert plan.kind == "band" and len(plan.calls) == 2  # 7 before
    with blocks(8, 4):
        check(h, g, "window", lq=203, lk=211, dtype=torch.float32, spec=spec)


@pytest.mark.parametrize("as_batch", [False, True], ids=["blocks x heads", "blocks as batch"])
@pytest.mark.parametrize("align", ALIGN)
@pytest.mark.parametrize("hg", GROUPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_band_forward_in_smaller_blocks_than_the_backward(align, hg, dtype, as_batch, monkeypatch):
    """With gradients a band plan's forward runs its interior in blocks of 8 rows (fewer
    masked entries) and the backward in blocks of 32, from the same rows' output and
    log-sum-exp; the forward's interior as one call over (batch-heads, blocks) or with the
    blocks as the call's batch (the output then in (L, N, d) memory)."""
    monkeypatch.setattr(plans, "BLOCKS_AS_BATCH", 1 if as_batch else 10**9)
    h, g = hg
    spec = S.sliding_window(10, 5, align) & S.causal(align)
    q, k = torch.zeros(2, h, 203, 8), torch.zeros(2, g, 211, 8)
    with blocks(32, 8, band_forward=8):
        plan = bs.make_plan(AttentionCall("dot", q, k, k, mask=spec.mask, scale=1.0), 32, 8)
        assert plan.kind == "band" and plan.interior_blocks >= 2
        assert plan.forward_plan.block == 8 and plan.forward_plan.interior_blocks >= 8
        check(h, g, "window", lq=203, lk=211, dtype=dtype, spec=spec)
