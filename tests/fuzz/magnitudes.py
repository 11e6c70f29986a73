"""The magnitude of a gradient: the size of the terms whose sum it is.

A gradient of attention is a sum of terms that can cancel: ``dS = W ⊙ (dW - rowsum(W ⊙ dW))``
is exactly 0 for a row with one key, the gradient of a key-projection bias ``b_k`` is exactly 0
for every input (adding one vector to every key shifts each row's scores by a constant, which
the softmax ignores), and ``dq = scale · dS @ k`` cancels when the keys nearly coincide. A
computed value of such a sum is accurate to a few rounding errors *of its terms*, not of the
(cancelled, possibly zero) result: the float64 reference itself returns rounding noise there
(e.g. 2e-17 for an exactly-zero ``b_k`` gradient), and a relative error against it is
meaningless. This is the usual a-priori bound of floating-point summation
(``|fl(Σ t) - Σ t| <= γ_n Σ |t|``, Higham, *Accuracy and Stability of Numerical Algorithms*,
§3.1) applied to the chain rule.

:func:`magnitudes` evaluates the reference's own chain rule (:mod:`tests.support.grads`) on the
absolute values of every array of the forward trace and of the cotangents, with the softmax
backward's centring replaced by its terms' size, ``W ⊙ (|dW| + rowsum(W ⊙ |dW|))`` where
``|dW| = |dO| |V|ᵀ (+ |d_weights|)``. The result, per input, bounds the sum of the absolute
values of the terms of its gradient; the fuzz harness allows an absolute error of
``HALF_FACTOR · eps · magnitude`` (:func:`tests.support.numerics.magnitude_floor`) besides the
relative tolerance, and does not compare a gradient whose terms overflow the dtype.

:func:`weight_shift` bounds how far weights computed from scores rounded at the compute dtype
may be from the exact ones (the softmax's conditioning); ``magnitudes(shift)`` propagates that
bound through the same chain rule to every gradient (used by the harness's score-rounding
allowance).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np

from tests.support import grads as G
from tests.support.numerics import HALF_FACTOR

_WRAPPED = ("dot", "general", "additive", "multi_head")


SIGNED = ("q_proj", "k_proj")
"""Trace fields kept as they are: additive attention's gradient uses them only through
sech²(q_proj + k_proj) > 0 (tests/support/grads.py), which |q_proj| + |k_proj| would shrink."""


def _abs(x):
    """|x| for float arrays, recursively through traces (dataclasses, except the fields in
    SIGNED), tuples, lists, dicts."""
    if isinstance(x, np.ndarray):
        return np.abs(x) if x.dtype.kind in "fc" else x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = [f.name for f in dataclasses.fields(x) if f.init and f.name not in SIGNED]
        return dataclasses.replace(x, **{n: _abs(getattr(x, n)) for n in fields})
    if isinstance(x, (tuple, list)):
        return type(x)(_abs(v) for v in x)
    if isinstance(x, dict):
        return {k: _abs(v) for k, v in x.items()}
    if isinstance(x, float):
        return abs(x)
    return x


def _softmax_backward_terms(trace, d_out, d_weights=None):
    """The size of the terms of (dS, dV) (inputs already absolute): no cancellation."""
    w = trace.weights
    dw = d_out @ np.swapaxes(trace.v, -1, -2)
    if d_weights is not None:
        dw = dw + d_weights
    return w * (dw + (dw * w).sum(-1, keepdims=True)), np.swapaxes(w, -1, -2) @ d_out


def _on_abs(fn):
    def wrapped(*args, **kw):
        return fn(*_abs(args), **_abs(kw))

    return wrapped


def _softmax_backward_shift(shift):
    """The change of (dS, dV) (inputs already absolute) when the weights W become any W' with
    |W' - W| <= ``shift`` (see :func:`weight_shift`): dS = W ⊙ (dW - D), D = rowsum(W ⊙ dW),
    so |ΔdS| <= shift ⊙ (|dW| + |D|) + (W + shift) ⊙ rowsum(shift ⊙ |dW|), |ΔdV| <= shiftᵀ |dO|.
    """

    def backward(trace, d_out, d_weights=None):
        w = trace.weights
        dw = d_out @ np.swapaxes(trace.v, -1, -2)
        if d_weights is not None:
            dw = dw + d_weights
        d = (w * dw).sum(-1, keepdims=True)
        d_shift = (shift * dw).sum(-1, keepdims=True)
        ds = shift * (dw + d) + (w + shift) * d_shift
        return ds, np.swapaxes(shift, -1, -2) @ d_out

    return backward


@contextlib.contextmanager
def magnitudes(shift: np.ndarray | None = None) -> Iterator[None]:
    """Within the block, the gradient functions of :mod:`tests.support.grads` return the
    magnitudes of the gradients (see the module docstring) instead of the gradients; with
    ``shift`` (a bound on the change of the weights, (..., Lq, Lk), :func:`weight_shift`), a
    bound on the change of the gradients that change of the weights makes instead (the rest of
    the chain rule is linear in (dS, dV) and runs on absolute values, as for the magnitudes)."""
    saved = {n: getattr(G, n) for n in (*_WRAPPED, "softmax_backward")}
    try:
        for n in _WRAPPED:
            setattr(G, n, _on_abs(saved[n]))
        G.softmax_backward = (
            _softmax_backward_terms if shift is None else _softmax_backward_shift(shift)
        )
        yield
    finally:
        for n, f in saved.items():
            setattr(G, n, f)


def weight_shift(scores: np.ndarray, size: np.ndarray, eps: float) -> np.ndarray:
    """How far softmax weights computed from scores rounded at ``eps`` may be from the exact
    ones: the conditioning of the softmax at the drawn scores, not an error of any backend.

    ``scores`` (..., Lq, Lk): the exact scores with the mask's bias added and -inf where no key
    is allowed; ``size`` (broadcastable): the size of the terms each score is a sum of (for
    additive attention Σ_h |w_v,h tanh(.)| plus what the rounding of the tanh's argument moves,
    plus |bias|). Any implementation at the dtype holds a score s + δ with |δ| <= Δ =
    HALF_FACTOR · eps · size (a sum's rounding error is a few eps of its terms' size, Higham
    §3.1); once Δ reaches the gaps between a row's scores the weights are not determined by
    the dtype (scores ~7.5e9 in float32 have ulp 512: keys 400 apart tie). Since
    W'_j / W_j = e^(δ_j) / Σ_k W_k e^(δ_k) lies within e^(±(Δ_j + max_k Δ_k)),
    ``|W' - W| <= min(1, W · expm1(Δ_j + max_k Δ_k))``, computed from log W (the weight of a key
    1,000 below the row max underflows float64 but not e^(Δ) times it). For well-conditioned
    rows (Δ ~ 1e-6) this is ~1e-6 · W, far below the float32 tolerance."""
    fin = np.isfinite(scores)
    delta = np.where(fin, HALF_FACTOR * eps * np.broadcast_to(size, scores.shape), 0.0)
    reach = delta + delta.max(-1, keepdims=True)
    top = np.where(fin, scores, -np.inf).max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        lse = top + np.log(np.where(fin, np.exp(scores - top), 0.0).sum(-1, keepdims=True))
        # log(expm1(r)) without overflow: r + log1p(-e^-r) for large r
        log_grow = np.where(reach > 30, reach, np.log(np.expm1(np.minimum(reach, 30))))
        shift = np.minimum(1.0, np.exp(scores - lse + log_grow))
    return np.where(fin & (reach > 0), shift, 0.0)
