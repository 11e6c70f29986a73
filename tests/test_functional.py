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

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import reference as R
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
