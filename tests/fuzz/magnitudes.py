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
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np

from tests.support import grads as G

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


@contextlib.contextmanager
def magnitudes() -> Iterator[None]:
    """Within the block, the gradient functions of :mod:`tests.support.grads` return the
    magnitudes of the gradients (see the module docstring) instead of the gradients."""
    saved = {n: getattr(G, n) for n in (*_WRAPPED, "softmax_backward")}
    try:
        for n in _WRAPPED:
            setattr(G, n, _on_abs(saved[n]))
        G.softmax_backward = _softmax_backward_terms
        yield
    finally:
        for n, f in saved.items():
            setattr(G, n, f)
