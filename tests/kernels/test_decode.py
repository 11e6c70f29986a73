"""The ``decode`` backend (kernels/decode/): a few query rows against a long cache.

Against the float64 reference (attnkit.reference, masks from tests/support/masks.py computed with
NumPy) and against a full forward with the same mask: every mask kind of the catalogue the backend
accepts, Lq in 1..16, odd Lk (1, 7, 97, 2049), grouped k/v heads, strided, expanded and
cache-buffer layouts, batch > 1 with different lengths through key padding, fully masked rows, and
non-finite or huge inputs (redone exactly: the result equals the ``dense`` backend's under the
policy). What it declines goes elsewhere with a reason (bias masks, gradients, long query blocks).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels import BACKENDS
from attnkit.kernels.decode import DECODE_MAX_Q, DECODE_MIN_BYTES, DECODE_MIN_KV
from tests.support import masks as S
from tests.support.numerics import rel_err, to_np

TOL = 2e-6  # float32 against float64, relative (norm); absolute floor below
ABS = 1e-6
ACCEPTED = (
    "none", "causal_tl", "causal_br", "window", "window_asym", "window_br", "window&causal",
    "key_padding", "key_padding_b1", "document", "prefix_lm", "predicate", "tensor_bool",
    "key_padding_mask", "causal|window", "document&causal", "raw_bool", "all_masked",
)  # fmt: skip
DECLINED = ("additive", "alibi", "alibi&causal", "tensor_float", "key_padding_mask_float")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qkv(batch, lq, lk, d=16, dv=12, g=None, seed=0):
    gen = _gen(seed)
    kv_batch = batch if g is None else batch[:-1] + (g,)
    q = torch.randn(batch + (lq, d), generator=gen)
    k = torch.randn(kv_batch + (lk, d), generator=gen)
    v = torch.randn(kv_batch + (lk, dv), generator=gen)
    return q, k, v


def _ref(q, k, v, mask_np, scale=None):
    """float64 reference; grouped k, v are repeated to q's heads first."""
    kk, vv = to_np(k), to_np(v)
    if k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        kk, vv = np.repeat(kk, rep, axis=-3), np.repeat(vv, rep, axis=-3)
    return R.scaled_dot_product(to_np(q), kk, vv, mask_np, scale=scale).output


def _close(got, ref):
    ref = np.asarray(ref)
    err = np.abs(to_np(got) - ref).max() if ref.size else 0.0
    assert rel_err(got, ref) <= TOL or err <= ABS, (rel_err(got, ref), err)


def _mask(kind, batch, lq, lk, seed=1):
    spec = S.make_case(kind, batch, lq, lk, seed) if kind != "none" else S.none()
    return spec


@pytest.mark.parametrize("kind", ACCEPTED)
@pytest.mark.parametrize("lq,lk", [(1, 1), (1, 7), (3, 97), (16, 2049), (5, 97)])
def test_every_accepted_mask_matches_the_reference(kind, lq, lk):
    batch = (2, 3)
    spec = _mask(kind, batch, lq, lk)
    if spec is None:
        pytest.skip(f"{kind} needs more batch dims")
    q, k, v = _qkv(batch, lq, lk)
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, spec.mask, backend="decode")
    _close(out, _ref(q, k, v, S.ref_mask(spec, batch, lq, lk)))


@pytest.mark.parametrize("kind", DECLINED)
def test_bias_masks_are_declined_with_a_reason(kind):
    batch, lq, lk = (2, 3), 1, 64
    spec = _mask(kind, batch, lq, lk)
    q, k, v = _qkv(batch, lq, lk)
    why = F.explain_dispatch(q, k, v, spec.mask, backend="decode").reasons["decode"]
    assert any("bias" in w for w in why), why
    assert F.explain_dispatch(q, k, v, spec.mask).chosen != "decode"


@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("kind", ["none", "causal_br", "window_br", "key_padding"])
@pytest.mark.parametrize("lq,lk", [(1, 2049), (4, 97), (16, 7)])
def test_grouped_heads_match_the_reference(g, kind, lq, lk):
    batch = (2, 4)
    spec = _mask(kind, batch, lq, lk)
    q, k, v = _qkv(batch, lq, lk, g=g, seed=3)
    with torch.no_grad():
        out = F.grouped_query_attention(q, k, v, spec.mask, backend="decode")
    _close(out, _ref(q, k, v, S.ref_mask(spec, batch, lq, lk)))


def _cache_layouts(k: torch.Tensor):
    """k (B, G, L, d) seen through the layouts a cache hands over."""
    b, g, n, d = k.shape
    buf = torch.full((b, g, n + 13, d), math.nan)  # a cache buffer with room to grow
    buf[:, :, :n] = k
    t = torch.full((b, n, g, d), math.nan)  # (B, L, G, d) stored, viewed as (B, G, L, d)
    t.copy_(k.transpose(1, 2))
    stepped = torch.full((b, g, 2 * n, 2 * d), math.nan)
    stepped[:, :, ::2, ::2] = k
    return {
        "buffer": buf[:, :, :n],
        "transposed": t.transpose(1, 2),
        "stepped": stepped[:, :, ::2, ::2],
        "offset": torch.cat([torch.zeros(7), k.flatten()])[7:].view(k.shape),
    }


@pytest.mark.parametrize("layout", ["buffer", "transposed", "stepped", "offset"])
@pytest.mark.parametrize("grouped", [False, True])
def test_strided_caches(layout, grouped):
    batch, lq, lk = (2, 4), 2, 97
    q, k, v = _qkv(batch, lq, lk, d=16, dv=16, g=2 if grouped else None, seed=5)
    ks, vs = _cache_layouts(k)[layout], _cache_layouts(v)[layout]
    mask = M.causal("bottom_right")
    fn = F.grouped_query_attention if grouped else F.scaled_dot_product_attention
    with torch.no_grad():
        out = fn(q, ks, vs, mask, backend="decode")
    _close(out, _ref(q, k, v, S.ref_mask(S.causal("bottom_right"), batch, lq, lk)))


def test_expanded_caches():
    """k and v shared by the batch (dim 0) and by the heads (dim 1) through expand."""
    q, k, v = _qkv((1, 1), 1, 97, seed=6)
    q = torch.randn((3, 4, 2, 16), generator=_gen(7))
    ke, ve = k.expand(3, 4, 97, 16), v.expand(3, 4, 97, 12)
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, ke, ve, M.causal("bottom_right"), backend="decode")
    ref = _ref(q, ke, ve, S.ref_mask(S.causal("bottom_right"), (3, 4), 2, 97))
    _close(out, ref)


def test_batch_with_different_lengths_equals_each_row_alone():
    """Key padding with lengths 1, 50, 97: each batch row equals attention over its own keys."""
    lengths = [1, 50, 97]
    q, k, v = _qkv((3, 2), 1, 97, seed=8)
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, M.key_padding(lengths), backend="decode")
        for b, n in enumerate(lengths):
            alone = F.scaled_dot_product_attention(q[b], k[b, :, :n], v[b, :, :n], backend="math")
            _close(out[b], to_np(alone))
            _close(out[b], _ref(q[b], k[b, :, :n], v[b, :, :n], None))


def test_decode_step_equals_the_last_rows_of_a_full_forward():
    """Cached decoding: Lq new rows against Lk keys with bottom-right causal and a window equal
    the last Lq rows of the full causal (top-left, Lq = Lk) forward on the dense backend."""
    lk, lq = 2049, 5
    q, k, v = _qkv((1, 4), lk, lk, seed=9)
    for full_mask, step_mask in [
        (M.causal(), M.causal("bottom_right")),
        (M.sliding_window(64, 0), M.sliding_window(64, 0, "bottom_right")),
    ]:
        with torch.no_grad():
            full = F.scaled_dot_product_attention(q, k, v, full_mask, backend="math")
            step = F.scaled_dot_product_attention(
                q[..., -lq:, :], k, v, step_mask, backend="decode"
            )
        _close(step, to_np(full[..., -lq:, :]))


def test_fully_masked_rows_give_zero():
    q, k, v = _qkv((3, 2), 2, 33, seed=10)
    mask = M.key_padding([0, 5, 33])
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, mask, backend="decode")
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    _close(out, _ref(q, k, v, S.ref_mask(S.key_padding([0, 5, 33]), (3, 2), 2, 33)))
    # a window that ends before the cache starts for every row: all zero, nothing read
    w = M.Band(-math.inf, -40, "bottom_right")
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, w, backend="decode")
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("where", ["k_allowed", "v_allowed", "k_masked", "v_masked", "q", "nan_v"])
def test_non_finite_inputs_follow_the_policy_exactly(where):
    """A NaN/inf anywhere makes the step redo the call under the policy (P6): the rows that
    attend to it are NaN, the others exact, as on the dense backend."""
    q, k, v = _qkv((2, 2), 2, 97, seed=11)
    mask = M.key_padding([60, 97])
    bad = {"k_allowed": (k, 0, 10), "v_allowed": (v, 1, 90), "k_masked": (k, 0, 80)}
    bad |= {"v_masked": (v, 0, 70), "q": (q, 1, 1), "nan_v": (v, 1, 3)}
    t, b, j = bad[where]
    clean = [x.clone() for x in (q, k, v)]  # the reference's inputs: rows not attending agree
    t[b, 0, j, 0] = math.nan if where == "nan_v" else math.inf
    with torch.no_grad():
        got = F.scaled_dot_product_attention(q, k, v, mask, backend="decode")
        exact = F.scaled_dot_product_attention(q, k, v, mask, backend="dense")
    torch.testing.assert_close(got, exact, rtol=0, atol=0, equal_nan=True)
    ok = ~torch.isnan(exact)
    assert ok.any()
    ref = _ref(*clean, S.ref_mask(S.key_padding([60, 97]), (2, 2), 2, 97))
    assert np.abs(to_np(got)[to_np(ok).astype(bool)] - ref[to_np(ok).astype(bool)]).max() < 1e-5


def test_huge_scores_are_redone_in_float64():
    """Scores beyond float32's bound (q and k entries of 1e20): the step redoes the call, which
    the policy computes in float64; the result matches the float64 reference."""
    q, k, v = _qkv((1, 2), 1, 64, seed=12)
    q, k = q * 1e20, k * 1e20
    with torch.no_grad():
        got = F.scaled_dot_product_attention(q, k, v, backend="decode")
    assert torch.isfinite(got).all()
    _close(got, _ref(q, k, v, None))


@pytest.mark.parametrize("mask", [M.causal(), M.causal("bottom_right")])
def test_a_scale_beyond_float32_with_a_mask_tile(mask):
    """scale = 1e300 on the masked (torch ops) path: no float32 can hold it, so the step is
    redone under the policy (float64), matching the float64 reference, not a conversion
    error."""
    q, k, v = _qkv((1, 2), 9, 11, seed=3)
    with torch.no_grad():
        got = F.scaled_dot_product_attention(q, k, v, mask, scale=1e300, backend="decode")
    allowed = mask.materialize(9, 11).numpy()
    want = R.scaled_dot_product(*(to_np(t) for t in (q, k, v)), allowed, scale=1e300).output
    assert np.abs(got.double().numpy() - want).max() <= 1e-5


LONG = max(DECODE_MIN_KV, DECODE_MIN_BYTES // (8 * 128 * 4)) + 1
"""A cache of 8 heads, d = 64, long enough for ``auto`` to take ``decode``."""


def test_dispatch_picks_decode_for_decode_shapes_and_names_it():
    q, k, v = _qkv((1, 8), 1, LONG, d=64, dv=64, seed=13)
    with torch.no_grad():
        d = F.explain_dispatch(q, k, v, M.causal("bottom_right"))
    assert d.chosen == "decode"
    assert "decode" in str(d)
    small = F.explain_dispatch(q[:, :1], k[:, :1], v[:, :1])  # one head: too few bytes
    assert small.chosen != "decode"
    assert any("MiB" in w for w in small.reasons["decode"]), small.reasons


def test_dispatch_reasons_for_what_decode_declines():
    q, k, v = _qkv((1, 8), DECODE_MAX_Q + 1, LONG, d=64, dv=64, seed=14)
    why = F.explain_dispatch(q, k, v).reasons["decode"]
    assert any("query rows" in w for w in why), why
    q1 = q[..., :1, :].clone().requires_grad_(True)
    d = F.explain_dispatch(q1, k, v)
    assert d.chosen != "decode"
    assert any("backward" in w for w in d.reasons["decode"]), d.reasons
    short = F.explain_dispatch(q[..., :1, :], k[..., :7, :], v[..., :7, :])
    assert short.chosen != "decode"
    assert any("SDPA" in w for w in short.reasons["decode"])
    wide = F.explain_dispatch(q[..., :1, :].double(), k.double(), v.double())
    assert wide.chosen != "decode"
    assert any("dtype" in w for w in wide.reasons["decode"])


def test_gradients_go_to_a_backend_with_a_backward():
    """Decoding is inference: with inputs that require grad, auto takes another backend and the
    gradient of q matches float64 autograd of the plain formula."""
    q, k, v = _qkv((1, 8), 1, LONG, d=64, dv=64, seed=15)
    q.requires_grad_(True)
    out = F.scaled_dot_product_attention(q, k, v, M.causal("bottom_right"))
    out.sum().backward()
    q64 = q.detach().double().requires_grad_(True)
    ref = torch.softmax(q64 @ k.double().transpose(-1, -2) / 8.0, -1) @ v.double()
    ref.sum().backward()
    assert rel_err(q.grad, to_np(q64.grad)) < 1e-5
    assert "decode" in BACKENDS


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3),
    g=st.sampled_from([1, 2, 4]),
    rep=st.sampled_from([1, 2, 3]),
    lq=st.integers(1, DECODE_MAX_Q),
    lk=st.integers(1, 300),
    left=st.one_of(st.none(), st.integers(0, 40)),
    pad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_decode_calls_match_the_reference(b, g, rep, lq, lk, left, pad, seed):
    """Random grouped decode calls with bottom-right causal or window masks, and key padding."""
    h = g * rep
    q, k, v = _qkv((b, h), lq, lk, g=g, seed=seed)
    spec = S.causal("bottom_right") if left is None else S.sliding_window(left, 0, "bottom_right")
    if pad:
        lengths = torch.randint(0, lk + 1, (b,), generator=_gen(seed)).tolist()
        spec = spec & S.key_padding(lengths)
    with torch.no_grad():
        out = F.grouped_query_attention(q, k, v, spec.mask, backend="decode")
    _close(out, _ref(q, k, v, S.ref_mask(spec, (b, h), lq, lk)))


def test_softcap_and_sinks_go_to_a_backend_that_applies_them():
    """decode applies neither: auto sends such a decode step elsewhere, with the reason, and
    the output matches the float64 reference of sinks and softcapping."""
    from attnkit.reference import scaled_dot_product_sinks

    q, k, v = _qkv((1, 8), 1, LONG, d=64, dv=64, seed=21)
    sinks = torch.randn(8)
    for opts, word in (({"softcap": 30.0}, "softcapping"), ({"sinks": sinks}, "sink")):
        d = F.explain_dispatch(q, k, v, **opts)
        assert d.chosen != "decode"
        assert any(word in w for w in d.reasons["decode"]), d.reasons
    got = F.scaled_dot_product_attention(q, k, v, softcap=30.0, sinks=sinks)
    ref = scaled_dot_product_sinks(
        q.double().numpy(), k.double().numpy(), v.double().numpy(), softcap=30.0,
        sinks=sinks.double().numpy(),
    ).output  # fmt: skip
    torch.testing.assert_close(got.double(), torch.from_numpy(ref), atol=1e-5, rtol=1e-5)
