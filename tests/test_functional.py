"""attnkit.functional against the float64 reference, for every backend that can serve a call.

Tolerances (relative = norm(diff) / norm(reference)): float64 <= 1e-10, float32 <= 1e-5. Rows
that a mask leaves without any key must be exactly 0 (output and weights), never NaN.

Backends are discovered from ``attnkit.kernels.BACKENDS``: a backend is run on a call when its
``not_supported_reasons`` for that call is empty, so new backends are picked up automatically;
the tests assert that ``math`` (and ``dense`` for dot-product calls without weights) really ran.
"""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import masks as M
from attnkit import reference as R
from attnkit.kernels.dispatch import WEIGHTS_LIMIT
from tests.support import backends
from tests.support import masks as S
from tests.support.masks import CATALOGUE, make_case, ref_mask
from tests.support.numerics import TOL, rel_err

DTYPES = [torch.float64, torch.float32]
THREADS = 2  # a multi-threaded pool for test_default_threads_agree (conftest sets 1)
# the backends auto considers plus those it never tries for the score kind (as before the move)
serving = functools.partial(backends.serving, ignore_speed=False)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run this module's many tiny calls on one intra-op thread (on a busy machine a thread pool
    makes each tiny call tens of ms); ``test_default_threads_agree`` covers the default count."""
    torch.set_num_threads(1)
    yield


# ---------------------------------------------------------------------------------------------
# helpers (rel_err, ref_mask, the mask catalogue and serving live in tests/support)
# ---------------------------------------------------------------------------------------------
def check(out, weights, ref, dtype, where: str) -> None:
    """Compare one result with the reference trace, including exact zeros on empty rows."""
    tol = TOL[dtype]
    assert out.dtype == dtype, where
    assert torch.isfinite(out).all(), f"{where}: non-finite output"
    err = rel_err(out, ref.output)
    assert err <= tol, f"{where}: output relative error {err:.3g} > {tol}"
    empty = ~ref.allowed.any(axis=-1)  # (..., Lq) rows with no allowed key
    if empty.any():
        o = out.detach().numpy()
        assert np.all(o[np.broadcast_to(empty, o.shape[:-1])] == 0), f"{where}: empty row != 0"
    if weights is not None:
        assert torch.isfinite(weights).all(), f"{where}: non-finite weights"
        err = rel_err(weights, ref.weights)
        assert err <= tol, f"{where}: weights relative error {err:.3g} > {tol}"
        wn = weights.detach().numpy()
        assert np.all(wn[empty] == 0), f"{where}: empty-row weights != 0"


def rand(gen: torch.Generator, *shape: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------------------------------------
# shapes and masks
# ---------------------------------------------------------------------------------------------
SHAPES = [  # batch, Lq, Lk, d_k, d_v
    ((), 1, 1, 3, 2),
    ((), 7, 97, 5, 3),
    ((2, 3), 7, 97, 4, 5),
    ((3,), 97, 7, 6, 2),
    ((1, 2), 13, 13, 8, 8),
]


# the mask kinds of tests/support/masks.py this module runs (the catalogue has more)
ALL_MASKS = [
    "none", "causal_tl", "causal_br", "window", "window_asym", "window&causal", "key_padding",
    "key_padding_b1", "document", "document_1d", "prefix_lm", "prefix_lm_batch", "predicate",
    "predicate_bh", "tensor_bool", "tensor_float", "key_padding_mask", "additive", "alibi",
    "alibi&causal", "causal|window", "key_padding|prefix", "raw_bool", "raw_float_heads",
    "all_masked",
]  # fmt: skip
FEW_MASKS = ["none", "causal_br", "key_padding", "tensor_float", "alibi&causal", "all_masked"]


def make_mask(name, batch, lq, lk, seed) -> S.Spec:
    spec = make_case(name, batch, lq, lk, seed)
    if spec is None:
        pytest.skip(f"mask {name!r} needs more batch dims than {batch}")
    return spec


def _cases(mask_names):
    return [
        pytest.param(
            shape,
            name,
            id=f"{name}-{'x'.join(map(str, shape[0])) or 'nobatch'}-{shape[1]}x{shape[2]}",
        )
        for shape in SHAPES
        for name in mask_names
        if len(shape[0]) >= CATALOGUE[name][1]
    ]


# ---------------------------------------------------------------------------------------------
# functional vs reference, every backend that can serve the call
# ---------------------------------------------------------------------------------------------
def run_all_backends(kind, fn, inputs, mask, ref, dtype, *, extra_kw=None, w=None, scale=None):
    """Run ``fn`` on every serving backend, without and with weights; return the names run."""
    ran = {False: [], True: []}
    for rw in (False, True):
        q, k, v = inputs[:3]
        if fn is F.general_attention:  # served as a dot-product call on q @ w
            names = serving("dot", q @ inputs[3], k, v, mask, rw=rw, scale=1.0)
        else:
            names = serving(kind, q, k, v, mask, rw=rw, scale=scale, **(w or {}))
        for name in names:
            res = fn(*inputs, mask, return_weights=rw, backend=name, **(extra_kw or {}))
            out, weights = res if rw else (res, None)
            if rw:
                assert weights is not None
            check(out, weights, ref, dtype, f"backend={name} return_weights={rw}")
            ran[rw].append(name)
    assert "math" in ran[False] and "math" in ran[True], ran
    return ran


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,mask_name", _cases(ALL_MASKS))
def test_scaled_dot_product_attention(shape, mask_name, dtype):
    batch, lq, lk, dk, dv = shape
    gen = torch.Generator().manual_seed(lq * 131 + lk)
    q, k, v = (rand(gen, *batch, n, d, dtype=dtype) for n, d in ((lq, dk), (lk, dk), (lk, dv)))
    spec = make_mask(mask_name, batch, lq, lk, seed=lk)
    mask = spec.mask
    ref = R.scaled_dot_product(
        q.double().numpy(), k.double().numpy(), v.double().numpy(), ref_mask(spec, batch, lq, lk)
    )
    ran = run_all_backends("dot", F.scaled_dot_product_attention, (q, k, v), mask, ref, dtype)
    assert "dense" in ran[False], ran


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,mask_name", _cases(FEW_MASKS))
def test_scaled_dot_product_attention_explicit_scale(shape, mask_name, dtype):
    batch, lq, lk, dk, dv = shape
    gen = torch.Generator().manual_seed(7)
    q, k, v = (rand(gen, *batch, n, d, dtype=dtype) for n, d in ((lq, dk), (lk, dk), (lk, dv)))
    spec = make_mask(mask_name, batch, lq, lk, seed=3)
    mask = spec.mask
    ref = R.scaled_dot_product(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        ref_mask(spec, batch, lq, lk),
        scale=0.7,
    )
    ran = run_all_backends(
        "dot",
        F.scaled_dot_product_attention,
        (q, k, v),
        mask,
        ref,
        dtype,
        extra_kw={"scale": 0.7},
        scale=0.7,
    )
    assert "dense" in ran[False], ran


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,mask_name", _cases(FEW_MASKS))
def test_dot_product_attention(shape, mask_name, dtype):
    batch, lq, lk, dk, dv = shape
    gen = torch.Generator().manual_seed(8)
    q, k, v = (rand(gen, *batch, n, d, dtype=dtype) for n, d in ((lq, dk), (lk, dk), (lk, dv)))
    spec = make_mask(mask_name, batch, lq, lk, seed=4)
    mask = spec.mask
    ref = R.dot_product(
        q.double().numpy(), k.double().numpy(), v.double().numpy(), ref_mask(spec, batch, lq, lk)
    )
    ran = run_all_backends("dot", F.dot_product_attention, (q, k, v), mask, ref, dtype, scale=1.0)
    assert "dense" in ran[False], ran


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,mask_name", _cases(FEW_MASKS))
def test_general_attention(shape, mask_name, dtype):
    batch, lq, lk, dk, dv = shape
    dq = dk + 2
    gen = torch.Generator().manual_seed(9)
    q, k, v = (rand(gen, *batch, n, d, dtype=dtype) for n, d in ((lq, dq), (lk, dk), (lk, dv)))
    w = rand(gen, dq, dk, dtype=dtype) / math.sqrt(dq)
    spec = make_mask(mask_name, batch, lq, lk, seed=5)
    mask = spec.mask
    ref = R.general(*(t.double().numpy() for t in (q, k, v, w)), ref_mask(spec, batch, lq, lk))
    ran = run_all_backends("dot", F.general_attention, (q, k, v, w), mask, ref, dtype)
    assert "dense" in ran[False], ran


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,mask_name", _cases(FEW_MASKS + ["document", "window&causal", "raw_float_heads"])
)
def test_additive_attention(shape, mask_name, dtype):
    batch, lq, lk, dk, dv = shape
    dq, h = dk + 1, 6
    gen = torch.Generator().manual_seed(10)
    q, k, v = (rand(gen, *batch, n, d, dtype=dtype) for n, d in ((lq, dq), (lk, dk), (lk, dv)))
    w_q, w_k, w_v = (
        rand(gen, h, dq, dtype=dtype),
        rand(gen, h, dk, dtype=dtype),
        rand(gen, h, dtype=dtype),
    )
    spec = make_mask(mask_name, batch, lq, lk, seed=6)
    mask = spec.mask
    ref = R.additive(
        *(t.double().numpy() for t in (q, k, v, w_q, w_k, w_v)), ref_mask(spec, batch, lq, lk)
    )
    run_all_backends(
        "additive",
        F.additive_attention,
        (q, k, v, w_q, w_k, w_v),
        mask,
        ref,
        dtype,
        w={"w_q": w_q, "w_k": w_k, "w_v": w_v},
    )


@pytest.mark.parametrize(
    "mask_name,dtype",
    [
        ("causal_br", torch.float32),
        ("window&causal", torch.float32),
        ("document", torch.float32),
        ("window&causal", torch.float64),
    ],
    ids=str,
)
def test_long_sequence(mask_name, dtype):
    """Lq = 1025 > Lk = 1023: several blocks for block-based backends, ragged last blocks."""
    shape = ((1, 1), 1025, 1023, 16, 8)
    test_scaled_dot_product_attention(shape, mask_name, dtype)


# ---------------------------------------------------------------------------------------------
# multi-head attention vs reference.multi_head
# ---------------------------------------------------------------------------------------------
MH_MASKS = {
    "none": lambda b, lq, lk, h, g: S.none(),
    "causal_br": lambda b, lq, lk, h, g: S.causal("bottom_right"),
    "key_padding": lambda b, lq, lk, h, g: S.key_padding(torch.tensor([0, lk - 2])[:b]),
    "predicate_heads": lambda b, lq, lk, h, g: S.predicate(
        lambda bi, hi, qi, kj: (qi + kj + hi) % 3 != 0, num_heads=h
    ),
    "raw_heads": lambda b, lq, lk, h, g: S.raw(torch.rand((h, lq, lk), generator=g) < 0.6),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_name", list(MH_MASKS))
@pytest.mark.parametrize(
    "b,lq,lk,e,e_kv,h,g,dk,dv,e_out",
    [
        (2, 7, 13, 10, 6, 4, 4, 3, 5, 9),
        (1, 1, 97, 8, 8, 2, 1, 4, 4, 8),
        (2, 9, 9, 12, 12, 6, 3, 2, 3, 12),
    ],
    ids=["mha", "mqa-L1", "gqa"],
)
def test_multi_head_attention(b, lq, lk, e, e_kv, h, g, dk, dv, e_out, mask_name, dtype):
    gen = torch.Generator().manual_seed(11)
    xq, xkv = rand(gen, b, lq, e, dtype=dtype), rand(gen, b, lk, e_kv, dtype=dtype)
    # torch.nn.Linear layout (out, in) for attnkit.functional
    w_q, w_k = rand(gen, h * dk, e, dtype=dtype), rand(gen, g * dk, e_kv, dtype=dtype)
    w_v, w_o = rand(gen, g * dv, e_kv, dtype=dtype), rand(gen, e_out, h * dv, dtype=dtype)
    b_q, b_k, b_v, b_o = (rand(gen, n, dtype=dtype) for n in (h * dk, g * dk, g * dv, e_out))
    spec = MH_MASKS[mask_name](b, lq, lk, h, gen)
    mask = spec.mask

    # reference (X @ W layout): biases as an extra input column of ones and an extra weight row;
    # grouped key/value heads as their head blocks repeated for every query head of the group
    def np64(t):
        return t.double().numpy()

    def ones(x):
        return np.concatenate([np64(x), np.ones(x.shape[:-1] + (1,))], axis=-1)

    rep = h // g
    wk_full = np.concatenate([np64(w_k).T, np64(b_k)[None]], axis=0).reshape(e_kv + 1, g, 1, dk)
    wv_full = np.concatenate([np64(w_v).T, np64(b_v)[None]], axis=0).reshape(e_kv + 1, g, 1, dv)
    wk_full = np.broadcast_to(wk_full, (e_kv + 1, g, rep, dk)).reshape(e_kv + 1, h * dk)
    wv_full = np.broadcast_to(wv_full, (e_kv + 1, g, rep, dv)).reshape(e_kv + 1, h * dv)
    ref = R.multi_head(
        ones(xq),
        ones(xkv),
        np.concatenate([np64(w_q).T, np64(b_q)[None]], axis=0),
        wk_full,
        wv_full,
        np64(w_o).T,
        h,
        mask=ref_mask(spec, (b, h), lq, lk),
    )
    ref_out = ref.output + np64(b_o)
    tol = TOL[dtype]
    probe_q = torch.zeros(b, h, lq, dk, dtype=dtype)
    probe_k = torch.zeros(b, h, lk, dk, dtype=dtype)
    probe_v = torch.zeros(b, h, lk, dv, dtype=dtype)
    ran = []
    for rw in (False, True):
        for name in serving("dot", probe_q, probe_k, probe_v, mask, rw=rw):
            out, weights = F.multi_head_attention(
                xq, xkv, xkv, h, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, mask,
                num_kv_heads=g, return_weights=rw, backend=name,
            )  # fmt: skip
            where = f"backend={name} return_weights={rw}"
            assert rel_err(out, ref_out) <= tol, where
            if rw:
                assert rel_err(weights, ref.weights) <= tol, where
                _, avg = F.multi_head_attention(
                    xq, xkv, xkv, h, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, mask,
                    num_kv_heads=g, return_weights=True, average_weights=True, backend=name,
                )  # fmt: skip
                assert rel_err(avg, ref.weights.mean(axis=-3)) <= tol, where
            else:
                assert weights is None
            ran.append(name)
    assert "math" in ran and "dense" in ran, ran


# ---------------------------------------------------------------------------------------------
# fully masked rows: zeros, no NaN, finite gradients
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mask_name", ["all_false", "all_minus_inf", "key_padding_zero", "causal_br_short_keys"]
)
def test_fully_masked_rows_forward_and_backward(mask_name):
    b, h, lq, lk, d = 2, 3, 7, 5, 4
    specs = {
        "all_false": S.raw(torch.zeros((lq, lk), dtype=torch.bool)),
        "all_minus_inf": S.raw(torch.full((b, 1, lq, lk), -math.inf, dtype=torch.float64)),
        "key_padding_zero": S.key_padding([0, 3]),
        "causal_br_short_keys": S.causal("bottom_right"),  # Lq > Lk: first rows see no key
    }
    spec = specs[mask_name]
    mask = spec.mask
    gen = torch.Generator().manual_seed(12)
    base = [rand(gen, b, h, n, d) for n in (lq, lk, lk)]
    ref = R.scaled_dot_product(*(t.numpy() for t in base), ref_mask(spec, (b, h), lq, lk))
    empty = ~ref.allowed.any(-1)
    assert empty.any()
    names = serving("dot", *(t.clone().requires_grad_() for t in base), mask, rw=False)
    assert {"math", "dense"} <= set(names), names
    for name in names:
        q, k, v = (t.clone().requires_grad_() for t in base)
        out = F.scaled_dot_product_attention(q, k, v, mask, backend=name)
        check(out, None, ref, torch.float64, name)
        assert out.requires_grad, f"{name}: output not connected to the autograd graph"
        (out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum().backward()
        for t, label in ((q, "q"), (k, "k"), (v, "v")):
            assert torch.isfinite(t.grad).all(), f"{name}: non-finite grad of {label}"
        assert np.all(q.grad.numpy()[empty] == 0), f"{name}: grad on empty rows"
    # additive attention too, in both dtypes (backends may serve only one)
    ws = [rand(gen, 3, d), rand(gen, 3, d), rand(gen, 3)]
    ran = []
    for dtype in DTYPES:
        m = mask.to(dtype) if isinstance(mask, torch.Tensor) and mask.is_floating_point() else mask
        w_q, w_k, w_v = (t.to(dtype) for t in ws)
        probe = [t.to(dtype).clone().requires_grad_() for t in base]
        for name in serving("additive", *probe, m, rw=False, w_q=w_q, w_k=w_k, w_v=w_v):
            q, k, v = (t.to(dtype).clone().requires_grad_() for t in base)
            out = F.additive_attention(q, k, v, w_q, w_k, w_v, m, backend=name)
            assert out.requires_grad, f"{name}: output not connected to the autograd graph"
            out.sum().backward()
            assert np.all(out.detach().numpy()[empty] == 0), name
            assert all(torch.isfinite(t.grad).all() for t in (q, k, v)), name
            ran.append(name)
    assert "math" in ran


# ---------------------------------------------------------------------------------------------
# gradcheck (float64, small sizes), every backend that can serve a call needing grad
# ---------------------------------------------------------------------------------------------
GRAD_MASKS = [None, M.causal("bottom_right"), M.key_padding([2, 0]), M.alibi(0.5) & M.causal()]


def _req(*ts):
    return [t.clone().requires_grad_() for t in ts]


@pytest.mark.parametrize(
    "mask", GRAD_MASKS, ids=["none", "causal_br", "key_padding", "alibi&causal"]
)
def test_gradcheck_scaled_and_unscaled(mask):
    gen = torch.Generator().manual_seed(13)
    q, k, v = _req(rand(gen, 2, 2, 3), rand(gen, 2, 3, 3), rand(gen, 2, 3, 2))
    names = serving("dot", q, k, v, mask, rw=False)
    assert {"math", "dense"} <= set(names), names
    for name in names:
        # full Jacobian for the scaled form; the unscaled form shares its code path, so the
        # cheaper random-projection check (fast_mode) is enough there
        for fn, fast in ((F.scaled_dot_product_attention, False), (F.dot_product_attention, True)):
            assert torch.autograd.gradcheck(
                lambda q, k, v, fn=fn, name=name: fn(q, k, v, mask, backend=name),
                (q, k, v),
                fast_mode=fast,
            ), (fn.__name__, name)
    # the weights are differentiable too (math backend)
    assert torch.autograd.gradcheck(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask, return_weights=True)[1],
        (q, k, v),
        fast_mode=True,
    )


@pytest.mark.parametrize("mask", GRAD_MASKS[:3], ids=["none", "causal_br", "key_padding"])
def test_gradcheck_additive_and_general(mask):
    gen = torch.Generator().manual_seed(14)
    q, k, v = _req(rand(gen, 2, 2, 3), rand(gen, 2, 3, 2), rand(gen, 2, 3, 2))
    w_q, w_k, w_v = _req(rand(gen, 3, 3), rand(gen, 3, 2), rand(gen, 3))
    names = serving("additive", q, k, v, mask, rw=False, w_q=w_q, w_k=w_k, w_v=w_v)
    assert "math" in names
    for name in names:
        assert torch.autograd.gradcheck(
            lambda *a, name=name: F.additive_attention(*a, mask, backend=name),
            (q, k, v, w_q, w_k, w_v),
        ), name
    (w,) = _req(rand(gen, 3, 2))
    for name in serving("dot", q @ w, k, v, mask, rw=False):
        assert torch.autograd.gradcheck(
            lambda *a, name=name: F.general_attention(*a, mask, backend=name),
            (q, k, v, w),
            fast_mode=True,
        ), name


def test_gradcheck_multi_head():
    gen = torch.Generator().manual_seed(15)
    b, lq, lk, e, h, dk = 2, 3, 4, 4, 2, 2
    xq, xkv = _req(rand(gen, b, lq, e), rand(gen, b, lk, e))
    ws = _req(*(rand(gen, h * dk, e) for _ in range(3)), rand(gen, e, h * dk))
    bs = _req(*(rand(gen, h * dk) for _ in range(3)), rand(gen, e))
    mask = M.causal("bottom_right")
    probe = torch.zeros(b, h, lq, dk, requires_grad=True, dtype=torch.float64)
    names = serving(
        "dot",
        probe,
        probe[..., :1, :].expand(b, h, lk, dk),
        probe[..., :1, :].expand(b, h, lk, dk),
        mask,
        rw=False,
    )
    assert {"math", "dense"} <= set(names), names
    for name in names:

        def fn(xq, xkv, wq, wk, wv, wo, bq, bk, bv, bo, name=name):
            return F.multi_head_attention(
                xq, xkv, xkv, h, wq, wk, wv, wo, bq, bk, bv, bo, mask, backend=name
            )[0]

        assert torch.autograd.gradcheck(fn, (xq, xkv, *ws, *bs), fast_mode=True), name


# ---------------------------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------------------------
def test_dropout_is_unbiased_and_keeps_empty_rows_zero():
    """E[dropout(w) @ v] = w @ v: the average over many independent draws (n copies of the same
    inputs along a batch dim, each with its own dropout pattern) approaches the reference."""
    gen = torch.Generator().manual_seed(16)
    n = 4000
    q, k, v = rand(gen, 2, 1, 3, 4), rand(gen, 2, 1, 5, 4), rand(gen, 2, 1, 5, 3)
    spec = S.key_padding([5, 0])
    mask = spec.mask
    ref = R.scaled_dot_product(q.numpy(), k.numpy(), v.numpy(), ref_mask(spec, (2, 1), 3, 5))
    q, k, v = (t.expand(2, n, *t.shape[2:]).contiguous() for t in (q, k, v))
    names = serving("dot", q, k, v, mask, rw=False)
    names = [
        name
        for name in names
        if not F.explain_dispatch(q, k, v, mask, dropout_p=0.5, backend=name).reasons[name]
    ]
    assert {"math", "dense"} <= set(names), names
    for name in names:
        torch.manual_seed(0)
        out = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.5, backend=name)
        assert torch.isfinite(out).all() and torch.all(out[1] == 0), name
        assert rel_err(out.mean(dim=1, keepdim=True), ref.output) < 0.05, name
        assert rel_err(out[:, :1], ref.output) > 0.05, f"{name}: dropout had no effect"
        same = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.0, backend=name)
        assert rel_err(same[:, :1], ref.output) <= TOL[torch.float64], name


def test_default_threads_agree():
    """A few cases again with torch's default thread count (multi-threaded kernel paths)."""
    torch.set_num_threads(THREADS)
    try:
        shape = ((3,), 97, 7, 6, 2)
        for dtype in DTYPES:
            for name in ("causal_br", "key_padding", "window&causal"):
                test_scaled_dot_product_attention(shape, name, dtype)
            for name in ("none", "key_padding"):
                test_additive_attention(shape, name, dtype)
    finally:
        torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------
# dispatcher
# ---------------------------------------------------------------------------------------------
def test_explain_dispatch_chooses_dense_without_mask():
    q = torch.randn(2, 3, 8, 16)
    d = F.explain_dispatch(q, q, q)
    assert d.chosen == "dense", str(d)
    assert set(d.reasons) >= {"dense", "math"}
    assert d.reasons["math"] == []  # math could serve it, but comes later
    text = str(d)
    assert "backend: dense" in text and "math" in text


def test_explain_dispatch_weights_go_to_math():
    q = torch.randn(1, 5, 4)
    d = F.explain_dispatch(q, q, q, M.causal(), return_weights=True)
    assert d.chosen == "math"
    assert any("weights" in r for r in d.reasons["dense"])


def test_forced_backend_that_cannot_serve_raises_with_reasons():
    q = torch.randn(1, 5, 4)
    reasons = F.explain_dispatch(q, q, q, return_weights=True, backend="dense").reasons["dense"]
    assert reasons
    with pytest.raises(ValueError) as info:
        F.scaled_dot_product_attention(q, q, q, return_weights=True, backend="dense")
    msg = str(info.value)
    assert msg.startswith("backend") and "'dense'" in msg
    for reason in reasons:
        assert reason in msg
    w = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"^backend.*'dense'.*score kind"):
        F.additive_attention(q, q, q, w, w, torch.randn(3), backend="dense")


def test_forced_backend_ignores_speed_reasons():
    """auto skips blocksparse on plain causal (dense is faster); forcing it still runs, exactly."""
    g = torch.Generator().manual_seed(3)
    q, k, v = rand(g, 2, 97, 8), rand(g, 2, 97, 8), rand(g, 2, 97, 5)
    auto = F.explain_dispatch(q, k, v, M.causal())
    assert auto.chosen == "dense" and any("causal" in r for r in auto.reasons["blocksparse"])
    forced = F.explain_dispatch(q, k, v, M.causal(), backend="blocksparse")
    assert forced.chosen == "blocksparse"
    out = F.scaled_dot_product_attention(q, k, v, M.causal(), backend="blocksparse")
    ref = R.scaled_dot_product(
        q.numpy(), k.numpy(), v.numpy(), mask=np.tril(np.ones((97, 97), bool))
    )
    assert rel_err(out, ref.output) <= TOL[torch.float64]


def test_return_weights_too_large_raises_and_explains():
    lq = WEIGHTS_LIMIT // 4096 + 1
    q, k = torch.randn(lq, 1), torch.randn(4096, 1)
    with pytest.raises(ValueError) as info:
        F.scaled_dot_product_attention(q, k, k, return_weights=True)
    msg = str(info.value)
    assert msg.startswith("return_weights") and f"{lq * 4096:,}" in msg
    assert "slice" in msg  # says how to ask for fewer
    F.scaled_dot_product_attention(q[:5], k, k, return_weights=True)  # a slice is fine


# ---------------------------------------------------------------------------------------------
# bad input: exception type, and the message starts with the offending argument's name
# ---------------------------------------------------------------------------------------------
_g = torch.Generator().manual_seed(17)
q_, k_, v_ = rand(_g, 2, 3, 4), rand(_g, 2, 5, 4), rand(_g, 2, 5, 6)
wq_, wk_, wv_ = rand(_g, 7, 4), rand(_g, 7, 4), rand(_g, 7)
sdpa, dpa = F.scaled_dot_product_attention, F.dot_product_attention
X_ = rand(_g, 2, 5, 8)
W8_ = rand(_g, 8, 8)


def _mha(**kw):
    args = dict(query=X_, key=X_, value=X_, num_heads=2, w_q=W8_, w_k=W8_, w_v=W8_, w_o=W8_)
    args.update(kw)
    return lambda: F.multi_head_attention(**args)


BAD = [
    ("q rank 1", lambda: sdpa(q_[0, 0], k_, v_), ValueError, "q"),
    ("q numpy", lambda: sdpa(q_.numpy(), k_, v_), TypeError, "q"),
    ("q int", lambda: sdpa(q_.long(), k_, v_), TypeError, "q"),
    ("q empty", lambda: sdpa(q_[:, :0], k_, v_), ValueError, "q"),
    ("k rank", lambda: sdpa(q_, k_[0], v_), ValueError, "k"),
    ("k d_k", lambda: sdpa(q_, k_[..., :3], v_), ValueError, "k"),
    ("k batch", lambda: sdpa(q_, k_[:1], v_), ValueError, "k"),
    ("k float32", lambda: sdpa(q_, k_.float(), v_), TypeError, "k"),
    ("k bool", lambda: sdpa(q_, k_ > 0, v_), TypeError, "k"),
    ("v Lk", lambda: sdpa(q_, k_, v_[:, :4]), ValueError, "v"),
    ("v batch", lambda: sdpa(q_, k_, v_[:1]), ValueError, "v"),
    ("v float16", lambda: sdpa(q_, k_, v_.half()), TypeError, "v"),
    (
        "mask shape",
        lambda: sdpa(q_, k_, v_, torch.ones(5, 3, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "mask batch",
        lambda: sdpa(q_, k_, v_, torch.ones(3, 3, 5, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    (
        "mask too many dims",
        lambda: sdpa(q_, k_, v_, torch.ones(1, 2, 3, 5, dtype=torch.bool)),
        ValueError,
        "mask",
    ),
    ("mask rank 1", lambda: sdpa(q_, k_, v_, torch.ones(5, dtype=torch.bool)), ValueError, "mask"),
    ("mask int", lambda: sdpa(q_, k_, v_, torch.ones(3, 5, dtype=torch.long)), TypeError, "mask"),
    ("mask list", lambda: sdpa(q_, k_, v_, [[True] * 5] * 3), TypeError, "mask"),
    ("mask numpy", lambda: sdpa(q_, k_, v_, np.ones((3, 5), bool)), TypeError, "mask"),
    ("mask object batch", lambda: sdpa(q_, k_, v_, M.key_padding([1, 2, 3])), ValueError, "mask"),
    (
        "mask tensor object",
        lambda: sdpa(q_, k_, v_, M.from_tensor(torch.ones(3, 4, dtype=torch.bool))),
        ValueError,
        "mask",
    ),
    ("dropout 1", lambda: sdpa(q_, k_, v_, dropout_p=1.0), ValueError, "dropout_p"),
    ("dropout < 0", lambda: sdpa(q_, k_, v_, dropout_p=-0.1), ValueError, "dropout_p"),
    ("dropout nan", lambda: sdpa(q_, k_, v_, dropout_p=math.nan), ValueError, "dropout_p"),
    ("dropout str", lambda: sdpa(q_, k_, v_, dropout_p="0.1"), TypeError, "dropout_p"),
    ("dropout bool", lambda: dpa(q_, k_, v_, dropout_p=True), TypeError, "dropout_p"),
    ("scale 0", lambda: sdpa(q_, k_, v_, scale=0.0), ValueError, "scale"),
    ("scale < 0", lambda: sdpa(q_, k_, v_, scale=-2), ValueError, "scale"),
    ("scale inf", lambda: sdpa(q_, k_, v_, scale=math.inf), ValueError, "scale"),
    ("scale nan", lambda: sdpa(q_, k_, v_, scale=math.nan), ValueError, "scale"),
    ("scale str", lambda: sdpa(q_, k_, v_, scale="0.5"), TypeError, "scale"),
    ("scale tensor", lambda: sdpa(q_, k_, v_, scale=torch.tensor([0.5, 1.0])), TypeError, "scale"),
    ("scale bool", lambda: sdpa(q_, k_, v_, scale=True), TypeError, "scale"),
    ("backend unknown", lambda: sdpa(q_, k_, v_, backend="flash9"), ValueError, "backend"),
    ("backend type", lambda: sdpa(q_, k_, v_, backend=None), TypeError, "backend"),
    ("return_weights int", lambda: sdpa(q_, k_, v_, return_weights=1), TypeError, "return_weights"),
    (
        "return_weights str",
        lambda: dpa(q_, k_, v_, return_weights="yes"),
        TypeError,
        "return_weights",
    ),
    (
        "additive w_v 2-D",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wq_),
        ValueError,
        "w_v",
    ),
    (
        "additive w_q shape",
        lambda: F.additive_attention(q_, k_, v_, wq_[:, :3], wk_, wv_),
        ValueError,
        "w_q",
    ),
    (
        "additive w_k shape",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_[:6], wv_),
        ValueError,
        "w_k",
    ),
    (
        "additive w_q int",
        lambda: F.additive_attention(q_, k_, v_, wq_.long(), wk_, wv_),
        TypeError,
        "w_q",
    ),
    (
        "additive w_v float32",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wv_.float()),
        TypeError,
        "w_v",
    ),
    (
        "additive Lk",
        lambda: F.additive_attention(q_, k_, v_[:, :2], wq_, wk_, wv_),
        ValueError,
        "v",
    ),
    (
        "additive return_weights",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wv_, return_weights=None),
        TypeError,
        "return_weights",
    ),
    (
        "additive backend",
        lambda: F.additive_attention(q_, k_, v_, wq_, wk_, wv_, backend="nope"),
        ValueError,
        "backend",
    ),
    ("general w shape", lambda: F.general_attention(q_, k_, v_, W8_), ValueError, "w"),
    ("general w 1-D", lambda: F.general_attention(q_, k_, v_, wv_), ValueError, "w"),
    (
        "general w float32",
        lambda: F.general_attention(q_, k_, v_, W8_[:4, :4].float()),
        TypeError,
        "w",
    ),
    ("general w numpy", lambda: F.general_attention(q_, k_, v_, np.eye(4)), TypeError, "w"),
    ("mha query rank", _mha(query=X_[0]), ValueError, "query"),
    ("mha key batch", _mha(key=X_[:1], value=X_[:1]), ValueError, "key"),
    ("mha value float32", _mha(value=X_.float()), TypeError, "value"),
    ("mha num_heads 0", _mha(num_heads=0), ValueError, "num_heads"),
    ("mha num_heads split", _mha(num_heads=3), ValueError, "w_q"),
    ("mha num_kv_heads", _mha(num_heads=4, num_kv_heads=3), ValueError, "num_kv_heads"),
    ("mha w_q in dim", _mha(w_q=W8_[:, :6]), ValueError, "w_q"),
    ("mha w_o in dim", _mha(w_o=W8_[:, :6]), ValueError, "w_o"),
    ("mha b_q shape", _mha(b_q=torch.zeros(7, dtype=torch.float64)), ValueError, "b_q"),
    ("mha b_o dtype", _mha(b_o=torch.zeros(8, dtype=torch.float32)), TypeError, "b_o"),
    ("mha average_weights", _mha(average_weights=1), TypeError, "average_weights"),
    ("mha mask shape", _mha(mask=torch.ones(2, 3, 5, 5, dtype=torch.bool)), ValueError, "mask"),
    ("mha scale", _mha(scale=-1.0), ValueError, "scale"),
    ("explain kind", lambda: F.explain_dispatch(q_, k_, v_, kind="cosine"), ValueError, "kind"),
    (
        "explain backend",
        lambda: F.explain_dispatch(q_, k_, v_, backend="nope"),
        ValueError,
        "backend",
    ),
]


@pytest.mark.parametrize("call,exc,name", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(call, exc, name):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert re.match(rf"{re.escape(name)}\b", msg), f"message should start with {name!r}: {msg}"
