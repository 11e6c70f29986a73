"""Both additive backends (``additive_fused`` and ``math``) on every memory layout, every mask
kind of the shared catalogue and odd sizes, against the float64 reference.

Every input (q, k, v, w_q, w_k, w_v) is built in the layout under test by
:func:`tests.support.layouts.make`; outputs are compared with :func:`attnkit.reference.additive`
and the gradients of q, k, v, w_q, w_k, w_v (and of every float mask tensor that requires grad)
with the float64 NumPy gradients of :mod:`tests.support.grads`. Tolerance: float32, relative
error <= 1e-5: norm of the difference over the norm of the reference, that norm floored at
0.1 * sqrt(size) for outputs and at 0.1 * norm(upstream gradient) for gradients (a gradient
that vanishes mathematically, e.g. w.r.t. k when Lk = 1, is float32 rounding noise of the
size of the upstream gradient). Rows without an allowed key must be exactly 0, with exactly 0
gradient (P1).

``additive_fused`` takes no score bias: biased masks are checked to be refused by it and routed
to ``math`` by ``backend="auto"`` (bias gradients included).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnkit import functional as F
from attnkit import reference as R
from attnkit.kernels import BACKENDS
from tests.support import grads as G
from tests.support.layouts import LAYOUTS, make
from tests.support.masks import KINDS, make_case, reduce_grad, ref_mask
from tests.support.numerics import rel_err

TOL = 1e-5
FLOOR = 0.1
"""The reference's norm is floored at FLOOR * sqrt(size) (see the module docstring)."""
BATCH = (2, 3)
DQ, DK, DV, H = 3, 5, 7, 6
SIZES = ((7, 97), (97, 7), (1, 7), (7, 1), (97, 97), (1, 1))
"""(Lq, Lk) pairs, cycled over the (kind, layout) grid: odd sizes, Lq != Lk, single rows/keys."""

FUSED = BACKENDS["additive_fused"]
needs_fused = pytest.mark.skipif(
    FUSED.available() is not None, reason=f"additive_fused unavailable: {FUSED.available()}"
)


def inputs(lq: int, lk: int, layout: str, seed: int):
    """q, k, v (BATCH, L, d) and w_q, w_k, w_v viewed in ``layout``, float32, requiring grad
    (the views retain their gradients)."""
    g = torch.Generator().manual_seed(seed)
    shapes = (BATCH + (lq, DQ), BATCH + (lk, DK), BATCH + (lk, DV), (H, DQ), (H, DK), (H,))
    scales = (1.0, 1.0, 1.0, DQ**-0.5, DK**-0.5, 2.0 * H**-0.5)
    xs = []
    for shape, scale in zip(shapes, scales):
        leaf, view = make(shape, layout, torch.float32, g)
        leaf = (leaf * scale).detach().requires_grad_()
        x = view(leaf)
        x.retain_grad()
        xs.append(x)
    return xs


def run_case(kind: str, layout: str, backend: str, index: int) -> None:
    lq, lk = SIZES[index % len(SIZES)]
    spec = make_case(kind, BATCH, lq, lk, seed=index)
    xs = inputs(lq, lk, layout, seed=index)
    m = ref_mask(spec, BATCH, lq, lk)
    ref = R.additive(*(x.detach().double().numpy() for x in xs), mask=m)
    biased = m is not None and m.dtype != np.bool_
    if backend == "additive_fused" and biased:
        with pytest.raises(ValueError, match="bias"):
            F.additive_attention(*xs, spec.mask, backend="additive_fused")
        d = F.explain_dispatch(*xs[:3], spec.mask, kind="additive", w_q=xs[3], w_k=xs[4], w_v=xs[5])
        assert d.chosen == "math", str(d)
        backend = "auto"  # what a user gets: math, with the bias gradient
    out = F.additive_attention(*xs, spec.mask, backend=backend)
    assert out.dtype == torch.float32 and out.shape == ref.output.shape
    assert rel_err(out, ref.output, entry_floor=FLOOR) <= TOL, (kind, layout, lq, lk)
    empty = ~np.broadcast_to(ref.allowed, ref.scores.shape).any(-1)  # rows without a key
    assert (out.detach().numpy()[empty] == 0).all()
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    leaves = spec.leaves()
    out.backward(d_out.float())
    want = G.additive(ref, *(x.detach().double().numpy() for x in xs[3:]), d_out.numpy())
    floor = FLOOR * float(d_out.norm())
    for name, x in zip(("q", "k", "v", "w_q", "w_k", "w_v"), xs):
        assert torch.isfinite(x.grad).all(), name
        e = rel_err(x.grad, want[name], floor)
        assert e <= TOL, (kind, layout, lq, lk, name, e)
    assert (xs[0].grad.numpy()[empty] == 0).all()  # P1: no gradient through an empty row
    for t, shape, nb in leaves:
        assert t.grad is not None, "the bias gradient was dropped"
        want_b = reduce_grad(np.where(ref.allowed, want["bias"], 0.0), shape, nb)
        assert rel_err(t.grad.reshape(want_b.shape), want_b, floor) <= TOL, (kind, layout, "bias")


GRID = [
    (kind, layout, n)
    for n, (kind, layout) in enumerate((kind, layout) for kind in KINDS for layout in LAYOUTS)
]


@needs_fused
@pytest.mark.parametrize("kind", KINDS)
def test_fused_every_layout(kind):
    for k, layout, n in GRID:
        if k == kind:
            run_case(kind, layout, "additive_fused", n)


@pytest.mark.parametrize("kind", KINDS)
def test_math_every_layout(kind):
    for k, layout, n in GRID:
        if k == kind:
            run_case(kind, layout, "math", n)
