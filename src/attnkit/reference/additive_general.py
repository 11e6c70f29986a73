"""Attention whose score function has weights: additive (Bahdanau, seed 004) and Luong's
general (bilinear) attention. Neither scales its scores (scale = 1)."""

from __future__ import annotations

import numpy as np

from attnkit.reference.inputs import as_float_array, check_qkv, check_weight
from attnkit.reference.steps import attend, transpose
from attnkit.reference.traces import AdditiveTrace, GeneralTrace

__all__ = ["additive", "general"]


def additive(
    Q: object,
    K: object,
    V: object,
    W_q: object,
    W_k: object,
    w_v: object,
    mask: object = None,
) -> AdditiveTrace:
    """Additive (Bahdanau) attention (seed 004).

    e_ij = w_vᵀ tanh(W_q Q_i + W_k K_j); alpha_ij = exp(e_ij) / sum_l exp(e_il) (over allowed
    keys, after adding a float mask); output_i = sum_j alpha_ij V_j. No scaling (scale = 1).

    Args:
        Q: (..., Lq, d_q); K: (..., Lk, d_k); V: (..., Lk, d_v).
        W_q: (h, d_q); W_k: (h, d_k); w_v: (h,).
        mask: as in :func:`~attnkit.reference.scaled_dot_product`.
    Returns:
        :class:`AdditiveTrace` (``hidden`` (..., Lq, Lk, h) is the tanh layer).
    """
    q, k, v = check_qkv(Q, K, V, same_width=False)
    wv = as_float_array("w_v", w_v)
    if wv.ndim != 1 or wv.shape[0] < 1:
        raise ValueError(f"w_v: expected shape (h,) with h >= 1, got {wv.shape}")
    h = wv.shape[0]
    wq = check_weight("W_q", W_q, (h, q.shape[-1]), "(h, d_q)")
    wk = check_weight("W_k", W_k, (h, k.shape[-1]), "(h, d_k)")
    q_proj = q @ wq.T  # row i: W_q Q_i
    k_proj = k @ wk.T  # row j: W_k K_j
    hidden = np.tanh(q_proj[..., :, None, :] + k_proj[..., None, :, :])  # (..., Lq, Lk, h)
    # e_ij = w_v . hidden_ij, summed in one order for every (i, j) (a product and a last-axis
    # sum; a BLAS matrix-vector product may sum some rows differently): equal hidden rows give
    # bit-equal scores, which matters when the scores are huge
    scores = (hidden * wv).sum(axis=-1)
    return AdditiveTrace(
        **attend(q, k, v, scores, 1.0, mask), q_proj=q_proj, k_proj=k_proj, hidden=hidden
    )


def general(Q: object, K: object, V: object, W: object, mask: object = None) -> GeneralTrace:
    """Luong's general (bilinear) attention: e_ij = Q_i W K_jᵀ, softmax, weighted sum of V.

    Args:
        Q: (..., Lq, d_q); K: (..., Lk, d_k); V: (..., Lk, d_v); W: (d_q, d_k).
        mask: as in :func:`~attnkit.reference.scaled_dot_product`.
    Returns:
        :class:`GeneralTrace`; ``q_w`` (..., Lq, d_k) = Q W, scale 1.
    """
    q, k, v = check_qkv(Q, K, V, same_width=False)
    w = check_weight("W", W, (q.shape[-1], k.shape[-1]), "(d_q, d_k)")
    q_w = q @ w
    scores = q_w @ transpose(k)
    return GeneralTrace(**attend(q, k, v, scores, 1.0, mask), q_w=q_w)
