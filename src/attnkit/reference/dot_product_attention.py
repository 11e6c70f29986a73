"""Dot-product attention, scaled (seeds 000, 001, 002) and unscaled (seed 004)."""

from __future__ import annotations

import math

from attnkit import checks
from attnkit.reference.inputs import check_qkv
from attnkit.reference.steps import attend, transpose
from attnkit.reference.traces import Trace

__all__ = ["dot_product", "scaled_dot_product"]


def scaled_dot_product(
    Q: object, K: object, V: object, mask: object = None, scale: float | None = None
) -> Trace:
    """Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k) + M) V (seeds 000, 001, 002).

    Steps (seed 002): scores S = Q Kᵀ; scaled = S / sqrt(d_k) (or S * ``scale``); masked =
    scaled + M (bool mask: -inf where False); A = softmax(masked) row by row; output = A V.

    Args:
        Q: (..., Lq, d_k); K: (..., Lk, d_k); V: (..., Lk, d_v) real numbers.
        mask: bool or float array broadcastable to (..., Lq, Lk) (module docstring), or None.
        scale: positive finite factor; default 1/sqrt(d_k).
    Returns:
        :class:`Trace`; ``output`` (..., Lq, d_v), ``weights`` (..., Lq, Lk).
    """
    q, k, v = check_qkv(Q, K, V, same_width=True)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else checks.finite_float("scale", scale)
    scores = q @ transpose(k)  # S_ij = Q_i . K_j
    return Trace(**attend(q, k, v, scores, s, mask))


def dot_product(Q: object, K: object, V: object, mask: object = None) -> Trace:
    """Unscaled dot-product attention softmax(Q Kᵀ + M) V (seed 004, seed 001's S_ij).

    Shapes and mask as in :func:`scaled_dot_product`; ``scale`` is 1.
    """
    q, k, v = check_qkv(Q, K, V, same_width=True)
    return Trace(**attend(q, k, v, q @ transpose(k), 1.0, mask))
