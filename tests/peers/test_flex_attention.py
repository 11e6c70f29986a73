"""PyTorch ``test/inductor/test_flex_attention.py`` semantics: mask_mods (causal, sliding
window, prefix LM, document masking, padding, arbitrary tensors) composed with ``and_masks`` /
``or_masks``, the ``tanh`` softcap score_mod, GQA (``enable_gqa``), forward and gradients,
against a float64 reference, on every backend that serves the call (hypothesis draws the mask
tree, the sizes around block boundaries, and the options).

The reference builds each mask's allowed matrix from its definition (index arithmetic here,
not :meth:`attnkit.masks.Mask.materialize`); a row with no allowed key gives 0 (attnkit's
convention; flex_attention returns 0 there too). Tolerance: float32 1e-5 absolute and
relative; gradients 1e-4 relative to the largest reference entry."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import masks
from attnkit.functional import grouped_query_attention

BACKENDS = ("auto", "blocksparse", "math", "dense", "decode")
SIZES = (1, 2, 5, 31, 64, 65, 127, 129, 200)


@st.composite
def leaf(draw, b, lq, lk):
    """(attnkit mask, allowed (B, Lq, Lk)) of one mask_mod."""
    i, j = torch.arange(lq).view(-1, 1), torch.arange(lk).view(1, -1)
    kind = draw(st.sampled_from(["causal", "window", "band", "padding", "doc", "prefix", "bool"]))
    align = draw(st.sampled_from(["top_left", "bottom_right"]))
    off = 0 if align == "top_left" else lk - lq
    if kind == "causal":
        return masks.causal(align), (j <= i + off).expand(b, lq, lk)
    if kind == "window":
        left, right = draw(st.integers(0, 40)), draw(st.integers(0, 40))
        ok = (j - (i + off) >= -left) & (j - (i + off) <= right)
        return masks.sliding_window(left, right, alignment=align), ok.expand(b, lq, lk)
    if kind == "band":
        lo = draw(st.integers(-50, 10))
        hi = lo + draw(st.integers(0, 60))
        ok = (j - (i + off) >= lo) & (j - (i + off) <= hi)
        return masks.Band(lo, hi, align), ok.expand(b, lq, lk)
    if kind == "padding":
        lens = torch.tensor(draw(st.lists(st.integers(0, lk + 5), min_size=b, max_size=b)))
        return masks.key_padding(lens), (j.view(1, 1, -1) < lens.view(-1, 1, 1)).expand(b, lq, lk)
    if kind == "doc" and lq == lk:
        ids = torch.tensor(sorted(draw(st.lists(st.integers(0, 3), min_size=lk, max_size=lk))))
        return masks.document(ids), (ids.view(-1, 1) == ids.view(1, -1)).expand(b, lq, lk)
    if kind == "prefix":
        n = draw(st.integers(0, lk + 3))
        ok = (j < n) | (j <= i + off)
        return masks.prefix_lm(n, alignment=align), ok.expand(b, lq, lk)
    seed = draw(st.integers(0, 2**16))
    t = torch.rand(b, 1, lq, lk, generator=torch.Generator().manual_seed(seed)) > 0.4
    return t, t[:, 0]


@st.composite
def calls(draw):
    b, h = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4]))
    g = draw(st.sampled_from([x for x in (1, 2, 4) if h % x == 0]))
    lq = draw(st.sampled_from(SIZES))
    lk = lq if draw(st.booleans()) else draw(st.sampled_from(SIZES + (257, 300)))
    m, ok = draw(leaf(b, lq, lk))
    op = draw(st.sampled_from([None, "and", "or"]))
    if op is not None:
        m2, ok2 = draw(leaf(b, lq, lk))
        if isinstance(m, torch.Tensor):  # compose objects only: a tensor becomes the 2nd leaf
            m, ok, m2, ok2 = m2, ok2, m, ok
        if not isinstance(m, torch.Tensor):
            m2 = masks.from_tensor(m2) if isinstance(m2, torch.Tensor) else m2
            m, ok = (m & m2, ok & ok2) if op == "and" else (m | m2, ok | ok2)
    cap = draw(st.sampled_from([None, 3.0]))
    sinks = draw(st.booleans())
    return b, h, g, lq, lk, m, ok, cap, sinks, draw(st.integers(0, 2**16))


def reference(q, k, v, allowed, cap, sinks):
    h, g = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(h // g, 1), v.repeat_interleave(h // g, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    allowed = allowed[:, None].expand(s.shape)
    s = s.masked_fill(~allowed, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    w = torch.softmax(s, -1)[..., : k.shape[-2]]
    return torch.where(allowed.any(-1, keepdim=True), w, torch.zeros_like(w)) @ v


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=calls())
def test_mask_mods_score_mods_every_backend(case):
    # test_flex_attention.py: test_mask_mod_combiners, test_sliding_window, test_prefix_lm,
    # test_doc_mask, test_tanh_approx (softcap), test_GQA; plus attention sinks
    b, h, g, lq, lk, m, ok, cap, use_sinks, seed = case
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, h, lq, 16, generator=gen), torch.randn(b, g, lk, 16, generator=gen)
    v = torch.randn(b, g, lk, 8, generator=gen)
    sinks = torch.randn(h, generator=gen) if use_sinks else None
    want = reference(
        q.double(), k.double(), v.double(), ok, cap, None if sinks is None else sinks.double()
    )
    served = 0
    for backend in BACKENDS:
        try:
            out = grouped_query_attention(q, k, v, m, backend=backend, softcap=cap, sinks=sinks)
        except ValueError as e:
            assert backend not in ("auto", "math") and "cannot serve this call" in str(e), e
            continue
        served += 1
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5, msg=backend)
    assert served >= 2


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=calls())
def test_mask_mods_score_mods_gradients(case):
    # test_flex_attention.py's backward checks (dq, dk, dv) and the sink's gradient
    b, h, g, lq, lk, m, ok, cap, use_sinks, seed = case
    gen = torch.Generator().manual_seed(seed)
    ins = [
        torch.randn(b, h, lq, 16, generator=gen), torch.randn(b, g, lk, 16, generator=gen),
        torch.randn(b, g, lk, 8, generator=gen),
    ] + ([torch.randn(h, generator=gen)] if use_sinks else [])  # fmt: skip
    ins = [t.requires_grad_() for t in ins]
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    sinks64 = ins64[3] if use_sinks else None
    want = reference(*ins64[:3], ok, cap, sinks64)
    dout = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    want_grads = torch.autograd.grad(want, ins64, dout)
    for backend in ("auto", "blocksparse", "math"):
        try:
            out = grouped_query_attention(
                *ins[:3], m, backend=backend, softcap=cap, sinks=ins[3] if use_sinks else None
            )
        except ValueError as e:
            assert backend == "blocksparse" and "cannot serve this call" in str(e), e
            continue
        grads = torch.autograd.grad(out, ins, dout.float())
        for name, a, w in zip(("q", "k", "v", "sinks"), grads, want_grads):
            tol = 1e-4 * max(1.0, float(w.abs().max()))
            torch.testing.assert_close(a.double(), w, rtol=0, atol=tol, msg=f"{backend} d{name}")
