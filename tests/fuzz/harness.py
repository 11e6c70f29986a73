"""Run one drawn call on every backend that can serve it and check it against the reference.

A :class:`Problem` holds the inputs (leaf tensors and the layout views a user would pass), the
mask spec, how to call attnkit, how to compute the float64 reference (output, weights and the
gradients of every input, from :mod:`tests.support.grads`) and a *plain* implementation at the
same dtype (the yardstick of :func:`tests.support.numerics.tolerance`).

Checked for every serving backend: output dtype, shape and finiteness; output, weights and the
gradient of every leaf (q, k, v, weights, float mask tensors that require grad) within the
dtype's tolerance; rows without any allowed key give output 0, weights 0 and q-gradient 0 (P1).
Gradients whose true value is not representable at the dtype (beyond finfo.max / 16, or below
finfo.tiny / eps), or whose terms are not (their magnitude, tests/fuzz/magnitudes.py, beyond
finfo.max / 16 of the compute dtype: the chain rule overflows it), or that the plain
implementation at the dtype returns as inf/NaN (the chain passes through the gradient of an
intermediate the call holds at the dtype, q W or a projection, beyond the dtype's range; the
backends give inf/NaN there too), are not compared. Besides
the relative tolerance, a gradient may be off by a few roundings of the size of its terms
(:func:`tests.support.numerics.magnitude_floor`): where it cancels to ~0, the reference is noise.

Where the problem gives its exact scores and the size of their terms (``Problem.scores``;
additive attention), every result may also be off by what rounding the scores at the compute
dtype moves it (:func:`_score_rounding`): at scores of 7.5e9 in float32 (ulp 512) keys ~400
apart tie, and no float32 implementation can return the float64 weights or their gradients.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tests.fuzz.magnitudes import magnitudes, weight_shift
from tests.support import layouts
from tests.support.masks import Spec, reduce_grad, ref_mask
from tests.support.numerics import (
    EXACT,
    HALF,
    Rounding,
    magnitude_floor,
    rel_err,
    split_mask,
    to_np,
    tolerance,
)


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
    # np_xs -> (exact scores (..., Lq, Lk) before the mask, the size of their terms): enables
    # the allowance for the rounding of the scores (:func:`_score_rounding`); needs input "v"
    scores: Callable | None = None

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
    with magnitudes():
        mag_g = p.reference(xs64, mask_np, d_out64, d_w64)[2]
    empty = ~split_mask(mask_np)[0].any(-1) if mask_np is not None and p.p1 else None
    tol = _plain_tolerances(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w)
    cond = _score_rounding(p, xs64, mask_np, d_out64, d_w64)
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
        _check(where, "output", out, ref_out, tol["out"], 0.0, cond.get("out", 0.0))
        if empty is not None and empty.any():
            o = to_np(out)
            assert np.all(o[np.broadcast_to(empty, o.shape[:-1])] == 0), f"{where}: P1 output"
        if p.rw:
            assert w is not None and torch.isfinite(w).all(), f"{where}: weights missing/NaN"
            _check(where, "weights", w, ref_w, tol["weights"], 0.0, cond.get("weights", 0.0))
            if empty is not None and empty.any():
                wn = to_np(w)
                assert np.all(wn[np.broadcast_to(empty, wn.shape[:-1])] == 0), f"{where}: P1 w"
        torch.autograd.backward([out] + ([w] if p.rw else []), [d_out] + ([d_w] if p.rw else []))
        for n, (leaf, view) in p.inputs.items():
            assert leaf.grad is not None, f"{where}: no gradient for {n}"
            want, mag = _leaf_grad(leaf, view, ref_g[n]), _leaf_grad(leaf, view, mag_g[n])
            c = _norm(_leaf_grad(leaf, view, cond["grads"][n])) if cond else 0.0
            _check_grad(where, n, leaf.grad, want, mag, tol[n], p.dtype, c)
        if "q" in p.inputs and empty is not None and empty.any():
            leaf, view = p.inputs["q"]
            dq = to_np(view(leaf.grad)) if view(leaf) is leaf else None
            if dq is not None:
                e = np.broadcast_to(empty, dq.shape[:-1])
                assert np.all(dq[e] == 0), f"{where}: P1 gradient of q on empty rows"
        for i, (t, shape, nb) in enumerate(mask_leaves):
            assert t.grad is not None, f"{where}: gradient of mask tensor {i} dropped"
            want = reduce_grad(ref_g["bias"], shape, nb).reshape(t.shape)
            mag = reduce_grad(mag_g["bias"], shape, nb).reshape(t.shape)
            c = _norm(reduce_grad(cond["grads"]["bias"], shape, nb)) if cond else 0.0
            _check_grad(where, f"mask tensor {i}", t.grad, want, mag, tol[f"mask{i}"], p.dtype, c)


def _norm(x) -> float:
    return float(np.linalg.norm(x))


def _check(where, n, got, want, tol, floor, cond) -> None:
    """``got`` within ``tol`` relative of ``want``, or within ``max(floor, tol · |want|) + cond``
    absolute (norms): the error of computing from the scores the dtype holds, plus ``cond``, how
    far those scores' exact result may be from ``want`` (:func:`_score_rounding`)."""
    err = rel_err(got, want)
    diff = _norm(to_np(got) - np.asarray(want))
    # a non-finite allowance (a chain rule that overflows float64) allows nothing
    allowed = max(floor, tol * _norm(want)) + (cond if math.isfinite(cond) else 0.0)
    assert err <= tol or diff <= allowed, (
        f"{where}: {n} rel err {err:.3g} > {tol:.3g} (abs err {diff:.3g} > {allowed:.3g}: "
        f"rounding floor of its terms {floor:.3g}, score rounding {cond:.3g})"
    )


def _check_grad(where, n, got, want, mag, tol, dtype, cond=0.0) -> None:
    """``got`` within ``tol`` relative of ``want``, or within the floor of its terms' size
    ``mag`` (the gradient's magnitude) plus ``cond`` (see :func:`_check`); skipped where
    ``want`` is not representable at the dtype or ``mag`` at the compute dtype (P4: the half
    types' gradients are computed in float32), and where ``tol`` is inf (a gradient the plain
    implementation cannot compute at the dtype)."""
    compute = torch.float32 if dtype in HALF else dtype
    if tol == math.inf or not (representable(want, dtype) and representable(mag, compute)):
        return
    assert torch.isfinite(got).all(), f"{where}: non-finite gradient of {n}"
    floor = magnitude_floor(dtype, _norm(mag))
    _check(where, f"gradient of {n}", got, want, tol, floor, cond)


def _score_rounding(p, xs64, mask_np, d_out64, d_w64) -> dict:
    """How far the exact result computed from the scores as the dtype holds them may be from
    the reference, where ``p.scores`` is set ({} otherwise): {"out": norm, "weights": norm,
    "grads": arrays like the reference's gradients}.

    The weights move by at most ``shift`` (:func:`tests.fuzz.magnitudes.weight_shift`: scores
    off by HALF_FACTOR · eps · the size of their terms at the compute dtype, P4), so the output
    by ``shift @ |v|`` and the gradients by the chain rule of that change
    (:func:`tests.fuzz.magnitudes.magnitudes` with ``shift``). Scores whose gaps are far above
    eps · |scores| (all but extreme draws) give allowances far below the tolerance; scores of
    7.5e9 in float32 (ulp 512) whose gaps are ~400 give O(1) weights: any float32 backend ties
    keys that the float64 reference separates, and its gradients follow the tie."""
    if p.scores is None:
        return {}
    compute = torch.float32 if p.dtype in HALF else p.dtype
    s, size = p.scores(xs64)
    size = np.broadcast_to(size, s.shape)
    allowed, bias = split_mask(mask_np)
    if bias is not None:
        s, size = s + bias, size + np.abs(bias)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    shift = weight_shift(s, size, torch.finfo(compute).eps)
    with magnitudes(shift):
        grads = p.reference(xs64, mask_np, d_out64, d_w64)[2]
    out = shift @ np.abs(xs64["v"])
    return {"out": _norm(out), "weights": _norm(shift) if p.rw else 0.0, "grads": grads}


def _plain_tolerances(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w) -> dict[str, float]:
    """Tolerance per result, from the error of the plain implementation at the same dtype and of
    the plain implementation with simulated rounding at the compute dtype (P4: float32 for the
    half types), which measures how ill-conditioned the drawn problem is."""
    errs = _plain_errors(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w, p.dtype, EXACT)
    # a gradient the plain implementation at the same dtype cannot compute (inf/NaN) passes
    # through a gradient of an intermediate held at the dtype that is beyond its range, such as
    # d(query W_qᵀ) ~ 1.5e5 in float16 (the gradient of W_q is ~800) or d(q W) ~ 1e40 in
    # float32 for general attention with q ~ 1e-30: it is not compared (see the module docstring)
    grads = [n for n in errs if n not in ("out", "weights")]
    unbounded = {n for n in grads if not math.isfinite(errs[n])}
    # the largest of a few simulated roundings at the compute dtype (one may cancel out)
    eps = torch.finfo(torch.float32 if p.dtype in HALF else p.dtype).eps
    # the output as returned, rounded to nearest at the half dtype: unit roundoff eps / 2
    stored = torch.finfo(p.dtype).eps / 2 if p.dtype in HALF else 0.0
    for seed in range(NOISY_RUNS):
        r = Rounding(eps, seed=seed, stored_eps=stored)
        noisy = _plain_errors(p, mask_np, ref_out, ref_w, ref_g, d_out, d_w, torch.float64, r)
        # NaN-aware: a plain run that overflows (NaN) must not hide the others' errors
        errs = {
            n: max((x for x in (e, noisy[n]) if not math.isnan(x)), default=e)
            for n, e in errs.items()
        }
    return {n: math.inf if n in unbounded else tolerance(p.dtype, e) for n, e in errs.items()}


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
