"""Run one drawn call on every backend that can serve it and check it against the reference.

A :class:`Problem` holds the inputs (leaf tensors and the layout views a user would pass), the
mask spec, how to call attnkit, how to compute the float64 reference (output, weights and the
gradients of every input, from :mod:`tests.support.grads`) and a *plain* implementation at the
same dtype (the yardstick of :func:`tests.support.numerics.tolerance`).

Checked for every serving backend: output dtype, shape and finiteness; output, weights and the
gradient of every leaf (q, k, v, weights, float mask tensors that require grad) within the
dtype's tolerance; rows without any allowed key give output 0, weights 0 and q-gradient 0 (P1).
Gradients whose true value is not representable at the dtype (beyond finfo.max / 16, or below
finfo.tiny / eps) are not compared.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tests.support import layouts
from tests.support.masks import Spec, reduce_grad, ref_mask
from tests.support.numerics import EXACT, HALF, Rounding, rel_err, split_mask, to_np, tolerance


def make_input(shape, layout, dtype, gen, exp=0, grad=True):
    """(leaf, view): ``layouts.make`` with values scaled by 10**exp, a leaf that requires grad."""
    leaf, view = layouts.make(tuple(shape), layout, dtype, gen)
    if exp:
        leaf = (leaf.double() * 10.0**exp).to(dtype)
    return leaf.requires_grad_(grad), view


def _leaf_grad(leaf: torch.Tensor, view, g: np.ndarray) -> np.ndarray:
    """The gradient of ``leaf`` given the gradient ``g`` of ``view(leaf)`` (float64)."""
    x = torch.zeros(leaf.shape, dtype=torch.float64, requires_grad=True)
    view(x).backward(torch.from_numpy(np.ascontiguousarray(g)))
    return x.grad.numpy()


NOISY_RUNS = 3
LAST_RUN: list[str] = []  # the backends the last call of run() checked (for diagnostics)


def representable(ref: np.ndarray, dtype: torch.dtype) -> bool:
    """True when the exact gradient fits the dtype (neither overflows nor underflows)."""
    fi = torch.finfo(dtype)
    top = float(np.abs(ref).max()) if ref.size else 0.0
    return top == 0.0 or (fi.tiny / fi.eps < top < fi.max / 16)


@dataclass
class Problem:
    """One drawn call. ``inputs``: name -> (leaf, view); ``call(xs, mask, rw, backend)``;
    ``reference(np_xs, mask_array, d_out, d_w)`` -> (output, weights, grads by input name and
    "bias"); ``plain(xs, allowed, bias)`` -> (output, weights) at the inputs' dtype."""

    kind: str
    dtype: torch.dtype
    inputs: dict
    spec: Spec
    ref_batch: tuple[int, ...]
    lq: int
    lk: int
    call: Callable
    reference: Callable
    plain: Callable
    rw: bool = False
    p1: bool = True  # outputs/weights of rows without any allowed key must be exactly 0
    where: str = ""

    def xs(self) -> dict:
        return {n: view(leaf) for n, (leaf, view) in self.inputs.items()}


def run(p: Problem, names: list[str], gen: torch.Generator) -> None:
    """Check ``p`` on every backend in ``names`` (restricted to the comma-separated names in the
    environment variable ``FUZZ_BACKENDS`` when it is set, to study one backend at a time)."""
    assert "math" in names, f"{p.where}: math cannot serve a valid call: {names}"
    only = os.environ.get("FUZZ_BACKENDS")
    if only:
        names = [n for n in names if n in only.split(",")]
    LAST_RUN[:] = names
    xs64 = {n: to_np(view(leaf.detach().double())) for n, (leaf, view) in p.inputs.items()}
    mask_np = ref_mask(p.spec, p.ref_batch, p.lq, p.lk)
    # cotangents, rounded to the dtype the backward runs in (the reference uses the rounded ones)
    out0, w0, _ = p.reference(xs64, mask_np, None, None)
    d_out = torch.randn(out0.shape, generator=gen, dtype=torch.float64).to(p.dtype)
    d_w = torch.randn(w0.shape, generator=gen, dtype=torch.float64).to(p.dtype) if p.rw else None
    d_out64, d_w64 = to_np(d_out), None if d_w is None else to_np(d_w)
    ref_out, ref_w, ref_g = p.reference(xs64, mask_np, d_out64, d_w64)
    empty = ~split_mask(mask_np)[0].any(-1) if mask_np is not None and p.p1 else None
    tol = _plain_tolerances(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w)
    mask_leaves = p.spec.leaves()
    for name in names:
        for t, _, _ in mask_leaves:
            t.grad = None
        for leaf, _ in p.inputs.values():
            leaf.grad = None
        where = f"{p.where} backend={name}"
        res = p.call(p.xs(), p.spec.mask, p.rw, name)
        out, w = res if p.rw else (res, None)
        assert out.dtype == p.dtype, f"{where}: output dtype {out.dtype}"
        assert out.shape == ref_out.shape, f"{where}: output shape {tuple(out.shape)}"
        assert torch.isfinite(out).all(), f"{where}: non-finite output"
        err = rel_err(out, ref_out)
        assert err <= tol["out"], f"{where}: output rel err {err:.3g} > {tol['out']:.3g}"
        if empty is not None and empty.any():
            o = to_np(out)
            assert np.all(o[np.broadcast_to(empty, o.shape[:-1])] == 0), f"{where}: P1 output"
        if p.rw:
            assert w is not None and torch.isfinite(w).all(), f"{where}: weights missing/NaN"
            err = rel_err(w, ref_w)
            assert err <= tol["weights"], f"{where}: weights rel err {err:.3g}"
            if empty is not None and empty.any():
                wn = to_np(w)
                assert np.all(wn[np.broadcast_to(empty, wn.shape[:-1])] == 0), f"{where}: P1 w"
        torch.autograd.backward([out] + ([w] if p.rw else []), [d_out] + ([d_w] if p.rw else []))
        for n, (leaf, view) in p.inputs.items():
            assert leaf.grad is not None, f"{where}: no gradient for {n}"
            _check_grad(where, n, leaf.grad, _leaf_grad(leaf, view, ref_g[n]), tol[n], p.dtype)
        if "q" in p.inputs and empty is not None and empty.any():
            leaf, view = p.inputs["q"]
            dq = to_np(view(leaf.grad)) if view(leaf) is leaf else None
            if dq is not None:
                e = np.broadcast_to(empty, dq.shape[:-1])
                assert np.all(dq[e] == 0), f"{where}: P1 gradient of q on empty rows"
        for i, (t, shape, nb) in enumerate(mask_leaves):
            assert t.grad is not None, f"{where}: gradient of mask tensor {i} dropped"
            want = reduce_grad(ref_g["bias"], shape, nb).reshape(t.shape)
            _check_grad(where, f"mask tensor {i}", t.grad, want, tol[f"mask{i}"], p.dtype)


def _check_grad(where, n, got, want, tol, dtype) -> None:
    if not representable(want, dtype):
        return
    assert torch.isfinite(got).all(), f"{where}: non-finite gradient of {n}"
    err = rel_err(got, want)
    assert err <= tol, f"{where}: gradient of {n} rel err {err:.3g} > {tol:.3g}"


def _plain_tolerances(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w) -> dict[str, float]:
    """Tolerance per result, from the error of the plain implementation at the same dtype and of
    the plain implementation with simulated rounding at the compute dtype (P4: float32 for the
    half types), which measures how ill-conditioned the drawn problem is."""
    errs = _plain_errors(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w, p.dtype, EXACT)
    # the largest of a few simulated roundings at the compute dtype (one may cancel out)
    eps = torch.finfo(torch.float32 if p.dtype in HALF else p.dtype).eps
    for seed in range(NOISY_RUNS):
        r = Rounding(eps, seed=seed)
        noisy = _plain_errors(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w, torch.float64, r)
        errs = {n: max(e, noisy[n]) for n, e in errs.items()}
    return {n: tolerance(p.dtype, e) for n, e in errs.items()}


def _plain_errors(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w, dtype, r) -> dict[str, float]:
    """Relative errors of the plain implementation at ``dtype`` with rounding ``r``: output,
    weights, every leaf's gradient (through its layout, as the backends are checked) and every
    mask tensor's gradient ("mask0", ...)."""
    leaves = {n: leaf.detach().to(dtype).requires_grad_() for n, (leaf, _) in p.inputs.items()}
    xs = {n: view(leaves[n]) for n, (_, view) in p.inputs.items()}
    allowed, bias = split_mask(mask_np)
    full = ref_g["bias"].shape
    b = np.zeros(full) if bias is None else np.broadcast_to(bias, full)
    bt = torch.tensor(b, dtype=dtype, requires_grad=True)
    ok = None if allowed is None else np.broadcast_to(allowed, full)
    out, w = p.plain(xs, ok, bt, r)
    errs = {"out": rel_err(out, ref_out), "weights": rel_err(w, ref_w) if p.rw else 0.0}
    outs, cots = [out], [d_out.to(dtype)]
    if p.rw:
        outs.append(w)
        cots.append(d_w.to(dtype))
    torch.autograd.backward(outs, cots)
    for n, (leaf, view) in p.inputs.items():
        g = leaves[n].grad
        errs[n] = math.inf if g is None else rel_err(g, _leaf_grad(leaf, view, ref_g[n]))
    for i, (_, shape, nb) in enumerate(p.spec.leaves()):
        want = reduce_grad(ref_g["bias"], shape, nb)
        errs[f"mask{i}"] = rel_err(reduce_grad(to_np(bt.grad), shape, nb), want)
    return errs
