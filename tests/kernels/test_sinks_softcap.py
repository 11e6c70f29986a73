"""Attention-logit softcapping and attention sinks in every dot-product backend that serves them,
against the float64 NumPy reference (:func:`attnkit.reference.scaled_dot_product_sinks`) for
outputs and weights, and against autograd through a float64 torch implementation written here
(transformers' eager formula: cap, mask, append the sink column, softmax, drop it) for the
gradients of q, k, v and the sinks.

Axes (hypothesis, derandomized): batch and heads, Lq != Lk (odd sizes up to 150, so blocksparse
runs band, rows and document plans with several blocks), widths, every mask kind of the
catalogue (fully masked rows included), memory layouts, float32/float64, softcap None / mild /
hard, sinks None / small / large, grouped-query heads. Tolerances: float64 1e-10, float32 1e-5
relative (tests/support/numerics.py), with an absolute floor for results near 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import reference as R
from attnkit.kernels.call.base import AttentionCall
from attnkit.kernels.policy.numerics import fused_backward_ok, numerics
from tests.support import layouts
from tests.support.backends import serving
from tests.support.masks import KINDS, make_case, ref_mask
from tests.support.numerics import HALF_FACTOR, TOL, rel_err, split_mask
from tests.support.sinks import check_close, torch_reference

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)
CAPS = st.sampled_from([None, None, 0.5, 5.0, 50.0])
SINKS = st.sampled_from([None, 1.0, 4.0])  # None, or the spread of the drawn sink logits


@st.composite
def cases(draw, grouped: bool = False):
    b, h = draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4]))
    g = draw(st.sampled_from([d for d in (1, 2, 4) if h % d == 0])) if grouped else h
    return dict(
        b=b,
        h=h,
        g=g,
        lq=draw(st.integers(1, 150)),
        lk=draw(st.integers(1, 150)),
        d=draw(st.integers(1, 24)),
        dv=draw(st.integers(1, 24)),
        kind=draw(st.sampled_from(KINDS)),
        layouts=draw(st.lists(st.sampled_from(layouts.LAYOUTS), min_size=3, max_size=3)),
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        cap=draw(CAPS),
        sinks=draw(SINKS),
        grad=draw(st.booleans()),
        seed=draw(st.integers(0, 2**20)),
    )


def _check(c, fn):
    gen = torch.Generator().manual_seed(c["seed"])
    b, h, g, lq, lk, dt = c["b"], c["h"], c["g"], c["lq"], c["lk"], c["dtype"]
    spec = make_case(c["kind"], (b, h), lq, lk, gen)
    shapes = ((b, h, lq, c["d"]), (b, g, lk, c["d"]), (b, g, lk, c["dv"]))
    made = [layouts.make(s, lay, dt, gen) for s, lay in zip(shapes, c["layouts"])]
    leaves = [leaf.requires_grad_(c["grad"]) for leaf, _ in made]
    q, k, v = (view(leaf) for leaf, (_, view) in zip(leaves, made))
    sinks = None
    if c["sinks"] is not None:
        sinks = (torch.randn(h, generator=gen, dtype=torch.float64) * c["sinks"]).to(dt)
        sinks.requires_grad_(c["grad"])
    mask = None if spec is None else spec.mask
    kw = dict(softcap=c["cap"], sinks=sinks)
    rw = lq * lk <= 4096
    names = serving("dot", q, k, v, mask, rw=rw, **kw) if g == h else [None]
    assert names, "math serves every call"
    allowed, bias = split_mask(ref_mask(spec, (b, h), lq, lk))
    # the float64 references: NumPy (forward) and torch (autograd)
    x64 = [view(leaf.detach().double()).requires_grad_() for leaf, (_, view) in zip(leaves, made)]
    s64 = None if sinks is None else sinks.detach().double().requires_grad_()
    k64, v64 = (t.repeat_interleave(h // g, 1) for t in x64[1:])
    npm = ref_mask(spec, (b, h), lq, lk)
    tr = R.scaled_dot_product_sinks(
        x64[0].detach().numpy(), k64.detach().numpy(), v64.detach().numpy(), npm,
        softcap=c["cap"], sinks=None if s64 is None else s64.detach().numpy(),
    )  # fmt: skip
    al = (
        None
        if allowed is None
        else torch.from_numpy(np.broadcast_to(allowed, tr.scores.shape).copy())
    )
    bi = None if bias is None else torch.from_numpy(np.broadcast_to(bias, tr.scores.shape).copy())
    o64, w64 = torch_reference(x64[0], k64, v64, al, bi, tr.scale, c["cap"], s64)
    assert np.abs(o64.detach().numpy() - tr.output).max() <= 1e-12  # the two references agree
    go = torch.randn(o64.shape, generator=gen, dtype=torch.float64)
    if c["grad"]:
        refs = torch.autograd.grad(o64, [*x64, *([s64] if s64 is not None else [])], go)
    for name in names:
        out = fn(q, k, v, mask, backend=name or "auto", return_weights=rw and g == h, **kw)
        out, w = out if isinstance(out, tuple) else (out, None)
        where = f"{name} {c}"
        check_close(out.detach().double().numpy(), tr.output, dt, f"output {where}")
        if w is not None:
            check_close(w.detach().double().numpy(), tr.weights, dt, f"weights {where}")
        if c["grad"]:
            ins = [*leaves, *([sinks] if sinks is not None else [])]
            got = torch.autograd.grad(out, ins, go.to(dt), allow_unused=True)
            for n, a, r in zip("qkvs", got, refs):
                a = torch.zeros_like(r) if a is None else a
                check_close(a.double().numpy(), _leaf(r, made, n, leaves), dt, f"d{n} {where}")


def _leaf(r, made, n, leaves):
    """The reference gradient ``r`` of q/k/v's view (or of the sinks) as its leaf's gradient."""
    if n == "s":
        return r.numpy()
    i = "qkv".index(n)
    x = leaves[i].detach().double().requires_grad_()
    (dx,) = torch.autograd.grad(made[i][1](x), x, r)
    return dx.numpy()


@SETTINGS
@given(c=cases())
def test_every_backend_matches_the_reference(c):
    """Forward, weights and gradients (q, k, v, sinks) of every backend that serves the call."""
    _check(c, F.scaled_dot_product_attention)


@SETTINGS
@given(c=cases(grouped=True))
def test_grouped_query_heads(c):
    """k and v with G heads (blocksparse folds the G query heads per key/value head into the
    rows, each row keeping its own head's sink)."""
    _check(c, F.grouped_query_attention)


@pytest.mark.parametrize("backend", ["math", "blocksparse"])
@pytest.mark.parametrize("cap", [None, 2.0])
def test_a_fully_masked_row_with_a_sink_gives_zero(backend, cap):
    """Rows 3..5 have no allowed key: all of their weight is on the sink, output and gradient 0
    (and the sink's gradient gets nothing from them)."""
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    sinks = torch.tensor([0.5, -3.0], dtype=torch.float64, requires_grad=True)
    allowed = torch.ones(9, 9, dtype=torch.bool)
    allowed[3:6] = False
    out = F.scaled_dot_product_attention(
        q, k, v, allowed, softcap=cap, sinks=sinks, backend=backend
    )
    assert torch.equal(out[..., 3:6, :], torch.zeros_like(out[..., 3:6, :]))
    (gq,) = torch.autograd.grad(out.sum(), [q])
    assert torch.equal(gq[..., 3:6, :], torch.zeros_like(gq[..., 3:6, :]))
    assert float(out[..., :3, :].detach().abs().sum()) > 0


def test_a_sink_is_a_key_with_a_zero_value():
    """Independent check of the sink's meaning: a sink logit s_h equals one more key whose score
    is s_h in every row and whose value is 0 (computed by plain attention on the extended keys)."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 3, 7, 5), torch.randn(2, 3, 11, 5), torch.randn(2, 3, 11, 4)
    sinks = torch.randn(3) * 2
    # an extra key x with q . x * scale = s_h for every query: not expressible as a key vector
    # in general, so append the logit through an additive mask column instead
    scale = 5**-0.5
    kx = torch.cat([k, torch.zeros(2, 3, 1, 5)], -2)
    vx = torch.cat([v, torch.zeros(2, 3, 1, 4)], -2)
    bias = torch.zeros(3, 7, 12)
    bias[..., -1] = sinks[:, None]
    want = F.scaled_dot_product_attention(q, kx, vx, bias, scale=scale, backend="math")
    got = F.scaled_dot_product_attention(q, k, v, scale=scale, sinks=sinks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------
def test_explain_dispatch_says_what_each_backend_does():
    q = torch.randn(1, 2, 256, 8)
    d = F.explain_dispatch(q, q, q, F.check_mask(None, (1, 2), 256, 256), softcap=30.0)
    assert d.chosen == "math"  # no mask: nothing to skip, and dense has no softcap
    assert "softcapping" in "; ".join(d.reasons["dense"])
    from attnkit.masks import Causal, SlidingWindow

    for mask in (Causal(), SlidingWindow(16, 0)):
        d = F.explain_dispatch(q, q, q, mask, sinks=torch.zeros(2), softcap=30.0)
        assert d.chosen == "blocksparse", str(d)
        assert "attention sinks" in "; ".join(d.reasons["dense"])


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(softcap=0.0), ValueError, r"softcap: expected a positive finite number, got 0"),
        (dict(softcap=-1), ValueError, r"softcap: .*positive"),
        (dict(softcap=float("nan")), ValueError, r"softcap: .*nan"),
        (dict(softcap="50"), TypeError, r"softcap: expected"),
        (dict(softcap=True), TypeError, r"softcap: expected"),
        (dict(sinks=[0.0, 0.0]), TypeError, r"sinks: "),
        (dict(sinks=torch.zeros(3)), ValueError, r"sinks: expected shape \(H,\) = \(2,\)"),
        (dict(sinks=torch.zeros(2, 1)), ValueError, r"sinks: expected shape \(H,\)"),
        (dict(sinks=torch.zeros(2, dtype=torch.float64)), Exception, r"sinks: .*dtype"),
        (dict(sinks=torch.zeros(2, dtype=torch.long)), TypeError, r"sinks: "),
    ],
)
def test_bad_softcap_and_sinks_are_refused_before_any_work(kw, err, match):
    q = torch.randn(1, 2, 5, 4)
    for fn in (F.scaled_dot_product_attention, F.grouped_query_attention, F.explain_dispatch):
        with pytest.raises(err, match=match):
            fn(q, q, q, **kw)


def test_sinks_need_a_head_dim():
    q = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"sinks: .*head dim.*\(5, 4\)"):
        F.scaled_dot_product_attention(q, q, q, sinks=torch.zeros(5))


def test_additive_explain_refuses_softcap():
    q = torch.randn(3, 4)
    w = torch.randn(2, 4)
    with pytest.raises(ValueError, match="softcap, sinks: defined for dot-product"):
        F.explain_dispatch(q, q, q, kind="additive", w_q=w, w_k=w, w_v=w[0], softcap=3.0)


# ---------------------------------------------------------------------------------------------
# the overflow policy (P5) with a softcap
# ---------------------------------------------------------------------------------------------
def _call(q, k, cap, grad):
    q, k = q.requires_grad_(grad), k.requires_grad_(grad)
    return AttentionCall("dot", q, k, k, scale=1.0, softcap=cap)


def test_huge_q_dot_k_still_runs_in_float64():
    """q.k itself would overflow float32 (it is computed before the cap): float64, and the
    result equals the reference (every score saturates at +-cap)."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 6, 4) * 1e19, torch.randn(1, 2, 6, 4) * 1e19
    assert numerics(_call(q, k, 5.0, False))[0] == torch.float64
    v = torch.randn(1, 2, 6, 3)
    out = F.scaled_dot_product_attention(q, k, v, scale=1.0, softcap=5.0)
    tr = R.scaled_dot_product_sinks(q.double(), k.double(), v.double(), scale=1.0, softcap=5.0)
    check_close(out.double().numpy(), tr.output, torch.float32, "huge q.k")


def test_large_capped_scores_stay_in_float32_with_gradients():
    """|q.k| up to ~1e5: without a cap a call that needs gradients runs in float64 (the fused
    backward would be inexact); with softcap 50 the softmax sees at most 50, so it stays in
    float32 with the fused backward, and its gradients still match the float64 reference."""
    from attnkit.masks import Causal

    torch.manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 40, 8) * 120,
        torch.randn(1, 2, 40, 8) * 120,
        torch.randn(1, 2, 40, 8),
    )
    assert numerics(_call(q.clone(), k.clone(), None, True))[0] == torch.float64
    capped = _call(q.clone(), k.clone(), 50.0, True)
    assert numerics(capped)[0] == torch.float32 and fused_backward_ok(capped)
    sinks = torch.tensor([1.0, -2.0])
    xs = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out = F.scaled_dot_product_attention(
        *xs[:3], Causal(), scale=1.0, softcap=50.0, sinks=xs[3], backend="blocksparse"
    )
    x64 = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    allowed = torch.ones(40, 40, dtype=torch.bool).tril()
    o64, _ = torch_reference(*x64[:3], allowed, None, 1.0, 50.0, x64[3])
    check_close(out.detach().double().numpy(), o64.detach().numpy(), torch.float32, "output")
    go = torch.randn(o64.shape, dtype=torch.float64)
    x32 = [t.clone().requires_grad_() for t in (q, k, v, sinks)]  # plain float32: the floor
    o32, _ = torch_reference(*x32[:3], allowed, None, 1.0, 50.0, x32[3])
    plain = torch.autograd.grad(o32, x32, go.float())
    for a, r, p, n in zip(
        torch.autograd.grad(out, xs, go.float()), torch.autograd.grad(o64, x64, go), plain, "qkvs"
    ):
        tol = max(TOL[torch.float32], HALF_FACTOR * rel_err(p, r.numpy()))
        assert rel_err(a, r.numpy()) <= tol, f"d{n}: {rel_err(a, r.numpy()):.3g} > {tol:.3g}"


@pytest.mark.parametrize("backend", ["math", "blocksparse"])
def test_multi_head_attention_passes_softcap_and_sinks(backend):
    """multi_head_attention (H = 4 query heads over G = 2 key/value heads) equals the reference
    on the projected heads, with the output projection applied in float64."""
    from attnkit.masks import SlidingWindow

    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 37, 16, generator=g, dtype=torch.float64)
    wq, wk, wv = (torch.randn(n, 16, generator=g, dtype=torch.float64) / 4 for n in (32, 16, 16))
    wo = torch.randn(16, 32, generator=g, dtype=torch.float64) / 4
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    mask = SlidingWindow(5, 0)
    out, _ = F.multi_head_attention(
        x, x, x, 4, wq, wk, wv, wo, mask=mask, num_kv_heads=2, softcap=1.5, sinks=sinks,
        backend=backend,
    )  # fmt: skip
    q = (x @ wq.T).view(2, 37, 4, 8).transpose(1, 2).numpy()
    k = (x @ wk.T).view(2, 37, 2, 8).transpose(1, 2).repeat_interleave(2, 1).numpy()
    v = (x @ wv.T).view(2, 37, 2, 8).transpose(1, 2).repeat_interleave(2, 1).numpy()
    allowed = mask.materialize(37, 37).numpy()
    tr = R.scaled_dot_product_sinks(q, k, v, allowed, softcap=1.5, sinks=sinks.numpy())
    want = torch.from_numpy(tr.output).transpose(1, 2).reshape(2, 37, 32) @ wo.T
    check_close(out.detach().numpy(), want.numpy(), torch.float64, "multi_head_attention")
    with pytest.raises(ValueError, match=r"sinks: expected shape \(H,\) = \(4,\)"):
        F.multi_head_attention(x, x, x, 4, wq, wk, wv, wo, num_kv_heads=2, sinks=sinks[:2])
